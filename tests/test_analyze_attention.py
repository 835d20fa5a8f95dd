"""`bert-jax analyze attention`: the PNG grid, the head-view page (run in headless chromium when there is one,
with a check that a broken page fails it), the maps against the encoder for every family, and the command end to
end on a tiny random checkpoint and on MiniLM."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax.analysis import attention
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.models import encoder as model
from bert_jax.models import modernbert_keys
from test_readme_api import write_tiny_checkpoint
from tests.conftest import REPO_ROOT
from tests.conftest import assert_one_line_errors
from tests.conftest import compilation_cache_env
from tests.conftest import shared_path

TOKENS = ["[CLS]", "the", "king", "</script>", "[SEP]"]   # a token that would end the page's script if unescaped


def random_maps(layers=2, heads=3, n=5, seed=0) -> np.ndarray:
  """Softmax rows [layers, heads, n, n], none small enough to round to 0 in the page."""
  logits = np.random.default_rng(seed).normal(0.0, 0.5, (layers, heads, n, n))
  a = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  assert np.round(a, 3).min() > 0
  return a.astype(np.float32)


def page_json(page: str) -> dict:
  return json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1))


# ------------------------------------------------------------------------------------------- grid and page

def test_grid_has_a_panel_per_layer_and_head_labelled_by_the_tokens(tmp_path):
  a = random_maps(layers=2, heads=3, n=5)
  image = attention.grid_image(a, 5, gap=1)
  assert image.shape == (2 * 6 - 1, 3 * 6 - 1) and np.isnan(image).sum() == image.size - 2 * 3 * 25
  for r in range(2):
    for c in range(3):
      np.testing.assert_array_equal(image[6 * r:6 * r + 5, 6 * c:6 * c + 5], a[r, c])
  fig = attention.grid_figure(a, TOKENS, layers=[1, 4], title="t $x")   # `$` would be math mode
  ax = fig.axes[0]
  assert [t.get_text() for t in ax.get_yticklabels()] == TOKENS * 2
  assert [t.get_text() for t in ax.get_xticklabels()] == TOKENS * 3
  assert [t.get_text() for t in ax.texts] == ["layer 1", "layer 4", "head 0", "head 1", "head 2"]
  # Long inputs show their first max_tokens tokens, and say so.
  tokens = [f"t{i}" for i in range(9)]
  fig = attention.grid_figure(random_maps(1, 2, 9), tokens, layers=[0], max_tokens=4)
  assert fig.axes[0].images[0].get_array().shape == (4, 4 + 1 + 4)
  assert "first 4 of 9 tokens" in fig.texts[0].get_text()
  attention.plot_grid(a, TOKENS, str(tmp_path / "grid.png"), [1, 4])
  assert (tmp_path / "grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_page_embeds_the_data_lists_every_layer_and_head_and_needs_no_network():
  a = random_maps(layers=2, heads=3, n=5)
  page = attention.page_html(attention.page_data(a, TOKENS, [0, 0, 0, 1, 1], [2, 5]), "the <king> __DATA__")
  data = page_json(page)
  assert data["tokens"] == TOKENS and data["layers"] == [2, 5] and data["segments"] == [0, 0, 0, 1, 1]
  np.testing.assert_allclose(data["attention"], a, atol=5e-4)
  assert page.count("</script>") == 2 and "&lt;king&gt; __DATA__" in page   # the title: escaped, not substituted
  layers, heads = (re.search(f'<select id="{s}">(.*?)</select>', page).group(1) for s in ("layer", "head"))
  assert re.findall(r'value="(\w+)"', layers) == ["2", "5"]
  assert re.findall(r'value="(\w+)"', heads) == ["all", "0", "1", "2"]
  assert not re.search(r"""(src|href)\s*=\s*["']?[^"'\s>]*(http|//)""", page, re.I)
  assert "<link" not in page and "@import" not in page and "<script src" not in page


def test_inputs_plain_text_with_tab_pairs_or_json_lines(tmp_path):
  (tmp_path / "a.txt").write_text("the king .\n\nlong live\tthe queen\n")
  (tmp_path / "a.jsonl").write_text('{"text": "x", "text_b": "y"}\n{"input_ids": [2, 3]}\n')
  assert attention.read_records(str(tmp_path / "a.txt")) == [{"text": "the king ."},
                                                            {"text": "long live", "text_b": "the queen"}]
  records = attention.read_records(str(tmp_path / "a.jsonl"))
  assert [attention.describe(r, ["[CLS]", "[SEP]"]) for r in records] == ["x  |  y", "[CLS] [SEP]"]
  assert attention.pick_layers(None, 3) == [0, 1, 2] and attention.pick_layers(["2", "0"], 3) == [0, 2]
  with pytest.raises(ValueError, match="layers 0..2"):
    attention.pick_layers(["3"], 3)


# ------------------------------------------------------------------------------------------------- browser

def browse(page: pathlib.Path, fragment: str, tmp_path: pathlib.Path, size=(700, 400)) -> tuple[str, pathlib.Path]:
  """Opens file://page#fragment in headless chromium: (the DOM once its scripts ran, a screenshot). Fails on
  any console line (the page logs nothing, and chromium tags console.error and console.log alike) or uncaught
  error."""
  chromium = shutil.which("chromium") or shutil.which("chromium-browser")
  if chromium is None:
    pytest.skip("no chromium on PATH (Debian: apt-get install chromium) to run the page in")
  shot = tmp_path / f"{page.stem}.png"
  shot.unlink(missing_ok=True)
  run = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                        f"--user-data-dir={tmp_path / 'chromium_profile'}", f"--screenshot={shot}",
                        f"--window-size={size[0]},{size[1]}", "--dump-dom", f"{page.as_uri()}#{fragment}"],
                       capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr[-2000:]
  errors = [line for line in run.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
  assert not errors, errors
  return run.stdout, shot


def assert_drawn(dom: str, shot: pathlib.Path, status: str) -> None:
  """The page says it drew `status`, and the screenshot is a PNG with something on it."""
  found = re.search(r'<div id="status">(.*?)</div>', dom)
  assert found and found.group(1) == status, found and found.group(1)
  from PIL import Image  # pylint: disable=g-import-not-at-top
  pixels = np.asarray(Image.open(shot).convert("RGB"))
  ink = (pixels.min(-1) < 200).mean()   # the share of pixels that are not (near) white
  assert ink > 0.01 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 16, ink


def write_page(tmp_path, name, a, tokens=TOKENS, layers=(0, 1), edit=lambda page: page) -> pathlib.Path:
  path = tmp_path / f"{name}.html"
  page = attention.page_html(attention.page_data(a, tokens, [0] * len(tokens), list(layers)), name)
  path.write_text(edit(page))
  return path


def test_page_draws_each_view_and_hover_keeps_one_tokens_lines(tmp_path):
  a = random_maps(layers=2, heads=3, n=5)
  dom, shot = browse(write_page(tmp_path, "page", a), "layer=1&head=2", tmp_path)
  assert_drawn(dom, shot, "rendered 5 tokens, layer 1, head 2, 25 lines")
  # All heads, then a hover on the query token 1, as a user's mouse would: its 3 x 5 lines stay.
  hover = ('<script>document.querySelector(\'text[data-side="q"][data-i="1"]\').dispatchEvent(new Event('
           '"mouseenter")); const shown = [...document.querySelectorAll("line")].filter(l => l.style.display !== '
           '"none"); document.getElementById("status").textContent += "; " + shown.length + " shown, queries " + '
           '[...new Set(shown.map(l => l.dataset.q))];</script></body>')
  dom, shot = browse(write_page(tmp_path, "hover", a, edit=lambda p: p.replace("</body>", hover)), "layer=0&head=all",
                     tmp_path)
  assert_drawn(dom, shot, "rendered 5 tokens, layer 0, head all, 75 lines; 15 shown, queries 1")


def test_the_browser_check_fails_on_broken_pages(tmp_path):
  a = random_maps(layers=2, heads=3, n=5)
  thrown = write_page(tmp_path, "thrown", a, edit=lambda p: p.replace("render();\n</script>", "render(); oops();\n"
                                                                       "</script>"))
  with pytest.raises(AssertionError, match="Uncaught ReferenceError"):
    browse(thrown, "layer=0&head=0", tmp_path)
  unparsed = write_page(tmp_path, "unparsed", a, edit=lambda p: p.replace('"use strict";', '"use strict"; {'))
  with pytest.raises(AssertionError, match="Uncaught SyntaxError"):
    browse(unparsed, "layer=0&head=0", tmp_path)
  a[0, 0, 2, 3] = 0.0   # a pair it must not draw: the count says 24
  dom, shot = browse(write_page(tmp_path, "zero", a), "layer=0&head=0", tmp_path)
  with pytest.raises(AssertionError):
    assert_drawn(dom, shot, "rendered 5 tokens, layer 0, head 0, 25 lines")
  blank = tmp_path / "blank.html"
  blank.write_text('<html><body><div id="status">rendered 5 tokens, layer 0, head 0, 25 lines</div></body></html>')
  dom, shot = browse(blank, "", tmp_path)
  with pytest.raises(AssertionError):
    assert_drawn(dom, shot, "rendered 5 tokens, layer 0, head 0, 25 lines")


# --------------------------------------------------------------------------------------- model and command

SENTENCES = [{"text": "the king is dead ."}, {"text": "long live the king", "text_b": "and the queen"}]
_TINY = dict(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
             max_position_embeddings=40, hidden_dropout=0.0, attention_dropout=0.0)
FAMILIES = {
    "bert": {},
    "albert": {"embedding_size": 8, "share_layers": True},
    "roberta": {"position_pad_id": 1},
    "electra": {"embedding_size": 8},    # ELECTRA-small's projection, layers not shared
    "distilbert": {"type_vocab_size": 0},
    "modernbert": {**modernbert_keys.SWITCHES, "rope_theta": 160000.0, "local_rope_theta": 10000.0,
                   "norm_bias": False, "dense_bias": False, "global_attn_every_n_layers": 2,
                   "local_attention": 4, "layer_norm_eps": 1e-5},
}


def wordpiece(tmp_path) -> tokenizer_lib.WordPieceTokenizer:
  words = sorted({w for r in SENTENCES for t in r.values() for w in t.split()})
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
  return tokenizer_lib.WordPieceTokenizer(str(tmp_path / "vocab.txt"))


@pytest.mark.parametrize("family", FAMILIES)
def test_maps_are_the_encoders_attention_on_each_input_alone(family, tmp_path):
  cfg = model.BertConfig(**{**_TINY, **FAMILIES[family]})
  tok = wordpiece(tmp_path)
  ids, types = tok.encode_pair(SENTENCES[1]["text"], SENTENCES[1]["text_b"], max_length=40)
  encoder = model.BertEncoder(cfg)
  shapes = jax.eval_shape(encoder.init, jax.random.key(0), np.ones((1, 4), np.int32))["params"]
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: rng.normal(0.0, 0.3, s.shape).astype(np.float32), nn.unbox(shapes))
  maps = attention.compute(cfg, params, tok, SENTENCES, batch_size=2)   # one padded batch of both
  assert maps[1].tokens == tok.convert_ids_to_tokens(ids) and maps[1].tokens[0] == "[CLS]"
  assert maps[1].segments == list(types) and maps[1].title == "long live the king  |  and the queen"
  alone = encoder.apply({"params": params}, np.asarray(ids)[None], None, np.asarray(types)[None],
                        output_attentions=True)["attentions"][:, 0]
  assert maps[1].attentions.shape == (2, 2, len(ids), len(ids))
  np.testing.assert_allclose(maps[1].attentions, alone, atol=1e-5)
  np.testing.assert_allclose(maps[0].attentions.sum(-1), 1.0, atol=1e-5)


def run_command(*args, cache_dir: str):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", **compilation_cache_env(cache_dir)}
  run = subprocess.run([sys.executable, "-m", "bert_jax.cli", "analyze", "attention", *args], cwd=REPO_ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.slow
def test_command_on_a_tiny_checkpoint(tmp_path, compilation_cache_dir):
  write_tiny_checkpoint(tmp_path / "tiny", "the king is dead long live the queen")
  (tmp_path / "in.txt").write_text("the king is dead .\nlong live the king\tthe queen\n")
  out = tmp_path / "out"
  run_command(f"--checkpoint={tmp_path / 'tiny'}", f"--input={tmp_path / 'in.txt'}", f"--output_dir={out}",
              "--layers=1", cache_dir=compilation_cache_dir)
  assert sorted(os.listdir(out)) == ["attention_0.html", "attention_0.png", "attention_1.html", "attention_1.png",
                                     "index.html"]
  index = (out / "index.html").read_text()
  assert 'href="attention_0.html"' in index and 'href="attention_1.png"' in index
  data = page_json((out / "attention_1.html").read_text())
  assert data["tokens"] == ["[CLS]", "long", "live", "the", "king", "[SEP]", "the", "queen", "[SEP]"]
  assert data["segments"] == [0] * 6 + [1] * 3 and data["layers"] == [1] and data["num_heads"] == 2
  np.testing.assert_allclose(np.sum(data["attention"], -1), 1.0, atol=0.01)   # [1 layer, 2 heads, 9]


@pytest.mark.slow
def test_command_on_minilm_labels_its_word_pieces(tmp_path, compilation_cache_dir):
  ckpt = shared_path("minilm")
  ref = np.load(ckpt / "hf_reference.npz")
  (tmp_path / "in.jsonl").write_text(json.dumps({"text": json.loads(str(ref["sentences"]))[3][0]}) + "\n")
  run_command(f"--checkpoint={ckpt}", f"--input={tmp_path / 'in.jsonl'}", f"--output_dir={tmp_path}",
              cache_dir=compilation_cache_dir)
  data = page_json((tmp_path / "attention_0.html").read_text())
  tok = tokenizer_lib.WordPieceTokenizer(str(ckpt / "vocab.txt"))
  assert data["tokens"] == tok.convert_ids_to_tokens(ref["input_ids_3"])   # transformers' tokens
  assert "##bly" in data["tokens"] and data["layers"] == list(range(6)) and data["num_heads"] == 12
  np.testing.assert_allclose(np.sum(data["attention"], -1), 1.0, atol=0.01)


def test_a_pairs_second_text_is_marked_where_every_token_type_is_0():
  """RoBERTa's `<s> A </s></s> B </s>` has no token types: B starts after the first separator."""
  from bert_jax.tools import embed  # pylint: disable=g-import-not-at-top

  class Roberta:
    sep_id = 2
  ids = np.array([0, 5, 6, 2, 2, 7, 8, 2], np.int32)
  example = embed.Example(ids, np.zeros(8, np.int32))
  assert attention.segments(Roberta(), {"text": "a", "text_b": "b"}, example) == [0, 0, 0, 0, 1, 1, 1, 1]
  assert attention.segments(Roberta(), {"text": "a"}, example) == [0] * 8
  bert = embed.Example(ids, np.array([0, 0, 0, 0, 1, 1, 1, 1], np.int32))
  assert attention.segments(Roberta(), {"text": "a", "text_b": "b"}, bert) == [0, 0, 0, 0, 1, 1, 1, 1]


def test_input_ids_longer_than_max_length_are_truncated(tmp_path):
  """As the docs say of every input (`embed` itself refuses them: its outputs are per token)."""
  cfg = model.BertConfig(**_TINY)
  encoder = model.BertEncoder(cfg)
  shapes = jax.eval_shape(encoder.init, jax.random.key(0), np.ones((1, 4), np.int32))["params"]
  params = jax.tree.map(lambda s: np.zeros(s.shape, np.float32), nn.unbox(shapes))
  [m] = attention.compute(cfg, params, wordpiece(tmp_path), [{"input_ids": list(range(5, 25))}], max_length=8)
  assert len(m.tokens) == 8 and m.attentions.shape[-1] == 8


def test_an_input_line_without_text_names_the_file(tmp_path):
  (tmp_path / "notext.jsonl").write_text('{"text": "the king"}\n\n{"title": "a"}\n')
  with pytest.raises(ValueError, match=r"^.*notext.jsonl, line 3: expected a `text` or an `input_ids` field"):
    attention.read_records(str(tmp_path / "notext.jsonl"))


@pytest.mark.slow
def test_command_mistakes_are_one_line_and_exit_2(tmp_path):
  """An input without text (the checkpoint loaded), a flag out of its range, an --output_dir that is a file."""
  write_tiny_checkpoint(tmp_path / "tiny", "the king")
  (tmp_path / "README.md").write_text("a file\n")
  (tmp_path / "notext.jsonl").write_text('{"title": "a"}\n')
  cases = {("--checkpoint=tiny", "--input=notext.jsonl", "--output_dir=out"):
               "bert-jax analyze attention: notext.jsonl, line 1: expected a `text` or an `input_ids` field",
           ("--checkpoint=tiny", "--input=notext.jsonl", "--output_dir=out", "--max_length=0"):
               "bert-jax analyze attention: flag --max_length=0: 0 is not integer >= 8",
           ("--checkpoint=tiny", "--input=notext.jsonl", "--output_dir=README.md"):
               f"bert-jax analyze attention: cannot write {tmp_path}/README.md/index.html: its folder cannot be made"}
  assert_one_line_errors(["analyze", "attention"], cases, tmp_path)
