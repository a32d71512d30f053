"""A tokenizer with more tokens than its model has embedding rows (special tokens added to it):
the rows added before training, as the Tulu 3 notebook does (`model.resize_token_embeddings(len(tok))`
when `len(tok)` exceeds the rows), and again, the same, before an adapter trained on them loads
onto its base.

A token id past the last row would index out of the embedding matrix (an IndexError on CPU, a
device-side assert on a GPU) the first time a row holds it. Every new row starts at the mean of
the old rows (of the input embeddings, and of an untied output head): transformers samples new
rows around that mean, so a second resize would differ; the mean itself is the same every time, so
a LoRA base resized again for its adapter (`fit_for_adapter`) is the base the adapter trained on.

Under LoRA the base is frozen, so the new rows stay at that mean, as they do in the notebook's
LoRA run (it resizes, then wraps the model with LoRA on the projections only). Training them
would take peft's trainable tokens, which TRL 1.16's fused LM head cannot use (it reads the head's
`weight` and `bias` directly, past peft's wrapper): full fine-tuning trains them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rufus_data.folders.run_folder import TOKENIZER_CONFIG


@dataclass(frozen=True)
class Resize:
    """Rows `old` .. `new` - 1 were added to the input embeddings (and the output head)."""

    old: int
    new: int

    def note(self, lora: bool) -> str:
        trained = ("; under LoRA they stay there (the base is frozen, as in the Tulu 3 notebook's LoRA run): train "
                   "without LoRA to learn them" if lora else "")
        return (f"the tokenizer has {self.new - self.old} more tokens than the model's {self.old} embedding rows "
                f"(added special tokens): embeddings resized to {self.new} rows, the new ones at the mean of the "
                f"old{trained}")


def embedding_rows(model) -> int:
    return model.get_input_embeddings().weight.shape[0]


def fit_embeddings(model, vocabulary: int) -> Resize | None:
    """Resize `model`'s embeddings to `vocabulary` rows (the tokenizer's length) when it has fewer,
    the new rows at the mean of the old; None when every token already has a row (models often
    pad their rows past the tokenizer)."""
    import torch  # heavy: only with a model loaded

    rows = embedding_rows(model)
    if vocabulary <= rows:
        return None
    model.resize_token_embeddings(vocabulary, mean_resizing=False)
    layers = [model.get_input_embeddings(), model.get_output_embeddings()]
    with torch.no_grad():
        for layer in filter(None, layers):  # a tied head shares the input's weight: set twice, the same
            layer.weight[rows:] = layer.weight[:rows].mean(dim=0)
            if getattr(layer, "bias", None) is not None:
                layer.bias[rows:] = layer.bias[:rows].mean()
    return Resize(rows, vocabulary)


def fit_for_adapter(base, adapter_folder: str | Path) -> Resize | None:
    """Give `base` the rows its adapter's run trained with (its tokenizer's length, when the run
    keeps a tokenizer longer than the base's rows), before PeftModel loads the adapter onto it."""
    folder = Path(adapter_folder)
    if not (folder / TOKENIZER_CONFIG).exists():
        return None
    from transformers import AutoTokenizer  # heavy: only with a model loaded

    return fit_embeddings(base, len(AutoTokenizer.from_pretrained(str(folder))))
