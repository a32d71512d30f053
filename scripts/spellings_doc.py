"""Write docs/spellings.md: TRL's and lm-eval's options and what Rufus does with each, rendered from
the tables the CLIs use (rufus_train/trl_spellings.py, rufus_eval/lm_eval_spellings.py).
tests/test_cli_spellings.py fails when the file and the tables differ: run this then."""

from __future__ import annotations

from pathlib import Path

from rufus_data.base.borrowed_options import spellings_markdown
from rufus_eval.lm_eval_spellings import LM_EVAL_SPELLINGS
from rufus_train.trl_spellings import TRL_SPELLINGS

DOC = Path(__file__).resolve().parents[1] / "docs" / "spellings.md"


def rendered() -> str:
    return spellings_markdown({"rufus-train stage NAME": TRL_SPELLINGS, "rufus-eval suite NAME": LM_EVAL_SPELLINGS})


if __name__ == "__main__":
    DOC.write_text(rendered())
    print(DOC)
