"""The review pages in a real browser (Debian's headless Chromium): decontam's hits.html and
`rufus-eval vibe`'s side-by-side page render self-contained, the shared words are marked and
visible, the filters hide what they should, and a screenshot shows the marks in colour."""

from __future__ import annotations

import html
import json
import random
import re
import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import read_jsonl
from decontam_planting import sentence_reworded
from PIL import Image

from rufus_data.benchmarks import load_benchmarks
from rufus_data.decontam import DecontamConfig, decontam
from rufus_data.decontam.hits_page import HITS_PAGE
from rufus_data.folders.shards import write_shards
from rufus_eval.vibe_page import write_vibe_page

pytestmark = pytest.mark.browser

MARK_RGB = (0xFF, 0xD5, 0x4F)  # review_page.STYLE's mark background

# Run in the page after its own script: what a reader sees, written into the DOM for --dump-dom.
PROBE = """<script>
(function () {
  var result = {}, cards = Array.prototype.slice.call(document.querySelectorAll('.card'));
  var visible = function (el) { var box = el.getBoundingClientRect(), style = getComputedStyle(el);
    return box.width > 0 && box.height > 0 && style.visibility === 'visible' && style.display !== 'none'; };
  var marks = Array.prototype.slice.call(document.querySelectorAll('.card mark'));
  result.marks = marks.length;
  result.marks_visible = marks.filter(visible).length;
  result.mark_background = marks.length ? getComputedStyle(marks[0]).backgroundColor : null;
  result.cards = cards.length;
  result.filters = {};
  Array.prototype.slice.call(document.querySelectorAll('select[data-filter]')).forEach(function (select) {
    Array.prototype.slice.call(select.options).slice(1).forEach(function (option) {
      select.value = option.value;
      select.dispatchEvent(new Event('change'));
      result.filters[select.dataset.filter + '=' + option.value] = {
        shown: cards.filter(visible).map(function (c) { return c.dataset[select.dataset.filter]; }),
        counter: document.getElementById('shown').textContent};
    });
    select.value = '';
    select.dispatchEvent(new Event('change'));
  });
  var out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify(result);
  document.body.appendChild(out);
})();
</script>"""


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "the browser tests need Debian's chromium: apt-get install -y chromium (.ci/run installs it)"
    return found


def browse(page: Path, *args: str) -> str:
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,900", *args,
               page.resolve().as_uri()]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def rendered(page: Path, tmp_path: Path) -> dict:
    """The probe's findings on the page as Chromium rendered it (the page, with PROBE before </body>)."""
    probed = tmp_path / f"probed-{page.name}"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = browse(probed, "--dump-dom", "--virtual-time-budget=2000")
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.DOTALL)
    assert found, dom[-2000:]
    return json.loads(html.unescape(found.group(1)))


def screenshot(page: Path, tmp_path: Path) -> tuple[Path, int]:
    """A screenshot of the page (a PNG) and how many of its pixels have the marks' colour."""
    png = tmp_path / f"{page.stem}.png"
    browse(page, f"--screenshot={png}")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    image = Image.open(png).convert("RGB")
    assert image.size == (1200, 900)
    marked = sum(1 for pixel in image.getdata() if all(abs(a - b) <= 8 for a, b in zip(pixel, MARK_RGB)))
    return png, marked


@pytest.fixture(scope="module")
def hits(data_root, tmp_path_factory) -> Path:
    """decontam over Code Alpaca rows with a GSM8K problem embedded in a longer question, one
    reworded, and a MATH-500 problem copied: hits of two benchmarks, some text left unmarked."""
    items = load_benchmarks(["gsm8k", "math500"]).items
    gsm8k = [item for item in items if item.benchmark == "gsm8k"]
    math = next(item for item in items if item.benchmark == "math500" and len(item.problems[0].split()) > 25)
    rows = [{"source": "code_alpaca", "messages": [{"role": "user", "content": r["instruction"]},
                                                   {"role": "assistant", "content": r["output"] or "-"}]}
            for r in read_jsonl(data_root / "code_alpaca_2k" / "code_alpaca_2k.jsonl", limit=300)]
    planted = [
        ("homework", f"My cousin sent me this, can you check her answer of 12?\n\n{gsm8k[3].problems[0]}\n\nThanks a lot!",
         "Her answer looks wrong to me."),
        ("reworded", sentence_reworded(gsm8k[10].problems[0], random.Random(1)), "Let me think step by step."),
        ("math", math.problems[0], "I would start from the definition."),
    ]
    rows += [{"source": name, "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]}
             for name, user, reply in planted]
    table = pa.Table.from_pylist([{"id": f"{r['source']}-{i}", "source": r["source"], "label": r["source"],
                                   "messages": r["messages"]} for i, r in enumerate(rows)])
    root = tmp_path_factory.mktemp("hits-page")
    write_shards(table, root / "mix")
    result = decontam(root / "mix", root / "clean", DecontamConfig(against=["gsm8k", "math500"], workers=1))
    assert {"homework", "math"} <= set(result.hits.column("source").to_pylist())
    return root / "clean"


def test_hits_page_is_self_contained_and_pairs_every_hit_with_its_item(hits):
    page = (hits / HITS_PAGE).read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page) and "<link" not in page  # nothing fetched
    cards = re.findall(r'<section class="card" data-benchmark="([^"]+)" data-stage="([^"]+)">', page)
    table = pq.read_table(hits / "contaminated.parquet")
    assert sorted(cards) == sorted(zip(table.column("benchmark").to_pylist(), table.column("method").to_pylist()))
    assert "My cousin sent me this, can you check her answer of 12?" in page  # the training text, in full
    training, item = page.split("training row homework-")[1].split("</section>")[0].split('<div class="side">')
    assert "<mark>" in training and "<mark>" in item
    assert "My cousin sent me this" in training.split("<mark>")[0]  # only the words the item shares are marked
    assert "Thanks a lot!" in training.split("</mark>")[-1]


def test_hits_page_in_chromium_marks_and_filters(hits, tmp_path):
    page = hits / HITS_PAGE
    seen = rendered(page, tmp_path)
    print(json.dumps(seen, indent=1))
    assert seen["cards"] >= 2 and seen["marks"] >= 2 and seen["marks_visible"] >= 1
    assert seen["mark_background"] == "rgb(255, 213, 79)"
    math = seen["filters"]["benchmark=math500"]
    assert math["shown"] == ["math500"] * len(math["shown"]) and 0 < len(math["shown"]) < seen["cards"]
    assert math["counter"] == f"{len(math['shown'])} of {seen['cards']} shown"
    gsm8k = seen["filters"]["benchmark=gsm8k"]
    assert len(gsm8k["shown"]) + len(math["shown"]) == seen["cards"]
    assert sum(len(found["shown"]) for key, found in seen["filters"].items() if key.startswith("stage=")) == seen["cards"]
    png, marked = screenshot(page, tmp_path)
    print(f"screenshot {png}: {png.stat().st_size:,} bytes, {marked:,} pixels in the marks' colour")
    assert marked > 2_000  # the highlighted spans are on screen, in colour


def test_vibe_page_in_chromium_puts_the_checkpoints_side_by_side(tmp_path):
    answers = {"base": ["Hello! How can I help?", "Arr, I be a model."],
               "outputs/sft/checkpoint-20": ["Hi there.", "Ahoy, matey!"]}
    page = write_vibe_page(tmp_path / "vibe.html", ["Say hello.", "Talk like a pirate."], answers)
    dom = browse(page, "--dump-dom")
    assert dom.count('<section class="card"') == 2
    assert re.findall(r"<h3>([^<]+)</h3>", dom) == ["base", "outputs/sft/checkpoint-20"] * 2
    assert "Ahoy, matey!" in dom and "2 of 2 shown" in dom
    seen = rendered(page, tmp_path)
    assert seen["filters"]["prompt=2"]["shown"] == ["2"]
    png, _ = screenshot(page, tmp_path)
    assert png.stat().st_size > 10_000
