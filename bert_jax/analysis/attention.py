"""`bert-jax analyze attention`: every layer's and head's attention, as a PNG grid and a BertViz-style page.

    bert-jax analyze attention --checkpoint=DIR --input=sentences.txt --output_dir=attention/ [--layers=2,3]

Input: a file named *.jsonl or *.json is JSON lines ({"text": ..., "text_b": ... (optional)}, or {"input_ids":
...}, as `bert-jax embed` reads); any other file is plain text, one input per line, a tab between the two texts
of a pair. Each input is tokenized by the checkpoint's own tokenizer (the tick labels are its word pieces) and
truncated to --max_length tokens. For input i (its line among the non-empty ones, from 0) DIR gets:
  attention_{i}.png   one panel per layer (rows) and head (columns): query tokens down, key tokens across;
                      inputs longer than --max_tokens show their first --max_tokens tokens;
  attention_{i}.html  one self-contained page (data as JSON, no network) in the "head view" of BertViz (Vig
                      2019): a layer and a head selector ("all" overlays every head, one colour each), the
                      tokens in two columns and a line from each query (left) to each key (right) whose
                      opacity is the attention weight; hovering a token keeps only its lines. `#layer=L&head=H`
                      (H a number or `all`) picks the view; the page writes `rendered S tokens, layer L, head H,
                      N lines` into #status once drawn (N: the pairs whose rounded weight is not 0);
and DIR/index.html links every input's page and grid. Layers and heads count from 0; a layer's map is the
encoder's `output_attentions` (softmax probabilities over the keys).
"""

import html
import json
import os
import re
from typing import NamedTuple

from absl import app
from absl import flags
import numpy as np

from bert_jax import checkpoint_loader
from bert_jax import failures
from bert_jax import paths
from bert_jax.analysis import forward
from bert_jax.finetune import readers
from bert_jax.tools import embed

_MAX_TOKENS = 48   # tokens a grid panel shows at most: past this the tick labels stop being readable
_DECIMALS = 3      # weights in the page: 0.001 is below what an opacity shows


class Map(NamedTuple):
  """One input's attention: its title, word pieces, their segments (0/1) and [layers, heads, S, S] weights."""
  title: str
  tokens: list[str]
  segments: list[int]
  attentions: np.ndarray


def define_flags() -> None:
  """The command's flags, defined when the CLI runs it: importing this module defines none."""
  # Other `analyze` commands define some of these names too: a process importing several must not fail.
  flags.DEFINE_string("checkpoint", None, "Any checkpoint `checkpoint_loader` reads (HF directory, TF "
                      "checkpoint, bert_jax run).", allow_override=True)
  flags.DEFINE_string("input", None, "*.jsonl/*.json: JSON lines with `text` (+`text_b`); else plain text, one "
                      "input per line, a tab between a pair's texts.", allow_override=True)
  flags.DEFINE_string("output_dir", None, "Where attention_{i}.png, attention_{i}.html and index.html go.",
                      allow_override=True)
  flags.DEFINE_integer("max_length", 128, "Truncate each input to this many tokens (at least 8: the special "
                       "tokens and some text).", allow_override=True, lower_bound=8)
  flags.DEFINE_list("layers", None, "Layers to show (from 0); default: all.", allow_override=True)
  flags.DEFINE_integer("max_tokens", _MAX_TOKENS, "Tokens a PNG panel shows at most (the page shows all).",
                       lower_bound=1)
  flags.DEFINE_integer("batch_size", 8, "Examples per forward pass.", allow_override=True, lower_bound=1)
  flags.mark_flags_as_required(["checkpoint", "input", "output_dir"])


# ---------------------------------------------------------------------------------------------------- input

def read_records(path: str) -> list[dict]:
  """The input file as records {"text", "text_b"?} (JSON lines: as written); see the module docstring. A JSON
  line that is not an object with a `text` or `input_ids` is a DataError naming the file and the line."""
  # Lines end at "\n" only: str.splitlines also splits at U+2028 and U+0085, which JSON strings may hold.
  lines = [line.rstrip("\r") for line in readers.read_text(path).split("\n")]
  if path.endswith((".jsonl", ".json")):
    records = []
    for n, line in enumerate(lines, 1):
      if line.strip():
        records.append(readers.json_row(path, n, line))
        embed.input_kind(path, n, records[-1])   # a DataError when the line gives no input
    return records
  records = []
  for line in filter(str.strip, lines):
    text, _, text_b = line.partition("\t")
    records.append({"text": text, "text_b": text_b} if text_b else {"text": text})
  return records


def describe(record: dict, tokens: list[str]) -> str:
  """A one-line title for an input: its text(s), or its tokens when it came as ids."""
  if "text" not in record:
    return " ".join(tokens)
  return record["text"] + (f"  |  {record['text_b']}" if record.get("text_b") else "")


def pick_layers(layers, num_layers: int) -> list[int]:
  """--layers as sorted layer indices; all layers when None."""
  if not layers:
    return list(range(num_layers))
  picked = sorted({int(layer) for layer in layers})
  if picked[0] < 0 or picked[-1] >= num_layers:
    raise ValueError(f"--layers={','.join(map(str, layers))}: the model has layers 0..{num_layers - 1}")
  return picked


# ----------------------------------------------------------------------------------------------------- grid

def grid_image(attentions: np.ndarray, n: int, gap: int) -> np.ndarray:
  """The panels [layers, heads, >= n, >= n] cut to n x n and tiled into one array, `gap` NaN cells apart."""
  rows, cols = attentions.shape[:2]
  image = np.full((rows * (n + gap) - gap, cols * (n + gap) - gap), np.nan, np.float32)
  for r in range(rows):
    for c in range(cols):
      image[r * (n + gap):r * (n + gap) + n, c * (n + gap):c * (n + gap) + n] = attentions[r, c, :n, :n]
  return image


def grid_figure(attentions: np.ndarray, tokens: list[str], layers: list[int], max_tokens: int = _MAX_TOKENS,
                title: str = ""):
  """A matplotlib figure of `attentions` [len(layers), heads, S, S]: a panel per layer (row) and head
  (column), queries down and keys across, the first `max_tokens` tokens of each axis labelled by `tokens`.

  One image of all the panels (`grid_image`) in one Axes: a figure of 72 Axes takes half a minute to draw.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  n = min(len(tokens), max_tokens)
  rows, cols = attentions.shape[:2]
  gap = max(1, n // 8)
  cell = max(0.15, 1.2 / n)   # inches: 15 px a token at 100 dpi, room for a 6-point label
  label = 0.6 + 0.06 * max(len(t) for t in tokens[:n])   # inches for the tick labels and the layer names
  image = grid_image(attentions, n, gap)
  width, height = image.shape[1] * cell + label + 1.0, image.shape[0] * cell + label + 1.1
  fig = plt.figure(figsize=(width, height))
  ax = fig.add_axes((label / width, label / height, image.shape[1] * cell / width, image.shape[0] * cell / height))
  cmap = matplotlib.colormaps["Blues"].with_extremes(bad="white")
  shown = ax.imshow(image, cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto")
  for r in range(rows):
    for c in range(cols):
      ax.add_patch(matplotlib.patches.Rectangle((c * (n + gap) - 0.5, r * (n + gap) - 0.5), n, n, fill=False,
                                                linewidth=0.5, edgecolor="0.3"))
  labels = [_plain(t) for t in tokens[:n]]
  ax.set_yticks([r * (n + gap) + q for r in range(rows) for q in range(n)], labels * rows, fontsize=6)
  ax.set_xticks([c * (n + gap) + k for c in range(cols) for k in range(n)], labels * cols, fontsize=6, rotation=90)
  ax.tick_params(length=0)
  for spine in ax.spines.values():
    spine.set_visible(False)
  for r in range(rows):
    ax.text(-label / cell + 0.2, r * (n + gap) + n / 2 - 0.5, f"layer {layers[r]}", rotation=90, va="center",
            ha="left", fontsize=9)
  for c in range(cols):
    ax.text(c * (n + gap) + n / 2 - 0.5, -0.8, f"head {c}", ha="center", va="bottom", fontsize=9)
  more = f" (first {n} of {len(tokens)} tokens)" if n < len(tokens) else ""
  fig.suptitle(f"{_plain(title[:150])}{more}\nrows: query tokens, columns: key tokens", fontsize=9,
               y=1 - 0.1 / height, va="top")
  fig.colorbar(shown, cax=fig.add_axes((1 - 0.6 / width, 0.25, 0.12 / width, 0.5)))
  return fig


def _plain(text: str) -> str:
  """`text` as matplotlib shows it literally: a `$` would start math mode."""
  return text.replace("$", r"\$")


def plot_grid(attentions: np.ndarray, tokens: list[str], path: str, layers: list[int],
              max_tokens: int = _MAX_TOKENS, title: str = "") -> None:
  """Writes `grid_figure` as a PNG."""
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig = grid_figure(attentions, tokens, layers, max_tokens, title)
  fig.savefig(path, dpi=100)
  plt.close(fig)


# ----------------------------------------------------------------------------------------------------- page

def page_data(attentions: np.ndarray, tokens: list[str], segments, layers: list[int]) -> dict:
  """What a page embeds: tokens, their segments, the layer numbers and the weights rounded to _DECIMALS."""
  weights = np.round(attentions.astype(np.float64), _DECIMALS)
  return {"tokens": list(tokens), "segments": [int(s) for s in segments], "layers": list(layers),
          "num_heads": int(attentions.shape[1]), "attention": weights.tolist()}


def page_html(data: dict, title: str) -> str:
  """The head-view page for `page_data`'s dict: one file, no network."""
  payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")   # no `</script>` inside the data
  option = '<option value="{0}">{0}</option>'.format
  layers = "".join(option(layer) for layer in data["layers"])
  heads = option("all") + "".join(option(h) for h in range(data["num_heads"]))
  parts = {"TITLE": html.escape(title), "LAYERS": layers, "HEADS": heads, "DATA": payload}
  # One pass: a title may hold "__DATA__".
  return re.sub(r"__(TITLE|LAYERS|HEADS|DATA)__", lambda m: parts[m.group(1)], _PAGE)


def index_html(entries: list[tuple[int, str]]) -> str:
  """DIR/index.html: a link to each (i, title)'s page and grid."""
  items = "\n".join(f'<li><a href="attention_{i}.html">{html.escape(title)}</a> '
                    f'(<a href="attention_{i}.png">grid</a>)</li>' for i, title in entries)
  return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>Attention maps</title></head>\n'
          f"<body><h1>Attention maps</h1>\n<ol start=\"0\">\n{items}\n</ol></body></html>\n")


_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font-family: sans-serif; font-size: 13px; margin: 12px; }
#controls select { margin-right: 12px; }
#legend span { display: inline-block; padding: 1px 5px; margin: 2px; color: #fff; cursor: pointer; border-radius: 3px; }
#view text { font-family: monospace; font-size: 13px; cursor: default; }
#view text.b { fill: #8a4b08; }
#view text.on { font-weight: bold; }
#status { color: #555; margin-top: 6px; }
</style></head>
<body>
<div id="title">__TITLE__</div>
<div id="controls">Layer <select id="layer">__LAYERS__</select> Head <select id="head">__HEADS__</select></div>
<div id="legend"></div>
<svg id="view" width="10" height="10"></svg>
<div id="status">not rendered</div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const S = DATA.tokens.length, H = DATA.num_heads, ROW = 20, TOP = 20, GAP = 220;
const svg = document.getElementById("view"), NS = svg.namespaceURI;
const layerSelect = document.getElementById("layer"), headSelect = document.getElementById("head");
const widest = Math.max(...DATA.tokens.map(t => t.length), 4) * 8 + 10;
const leftX = widest, rightX = widest + GAP;
function color(h) { return "hsl(" + Math.round(360 * h / H) + ",75%,42%)"; }

for (let h = 0; h < H; h++) {   // the heads' colours; a click shows that head
  const swatch = document.createElement("span");
  swatch.textContent = h; swatch.style.background = color(h);
  swatch.onclick = () => select(layerSelect.value, h);
  document.getElementById("legend").appendChild(swatch);
}

function view() {   // the view the URL hash names: #layer=L&head=H (H a number or "all")
  const p = new URLSearchParams(location.hash.slice(1));
  const number = key => p.get(key) === null || p.get(key) === "" ? NaN : Number(p.get(key));
  const layer = number("layer"), head = number("head");
  return {layer: DATA.layers.includes(layer) ? layer : DATA.layers[0],
          head: Number.isInteger(head) && head >= 0 && head < H ? head : "all"};
}
function select(layer, head) { location.hash = "layer=" + layer + "&head=" + head; }

function element(name, attrs, text) {
  const e = document.createElementNS(NS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  svg.appendChild(e);
  return e;
}
function focus(side, i) {   // keep only token i's lines (side "q": its queries, "k": its keys); -1: all
  for (const line of svg.querySelectorAll("line")) {
    const keep = i < 0 || Number(line.dataset[side]) === i;
    line.style.display = keep ? "" : "none";
  }
  for (const t of svg.querySelectorAll("text")) {
    t.classList.toggle("on", i >= 0 && Number(t.dataset.i) === i && t.dataset.side === side);
  }
}

function render() {
  const {layer, head} = view();
  layerSelect.value = layer; headSelect.value = head;
  svg.replaceChildren();
  svg.setAttribute("width", rightX + widest);
  svg.setAttribute("height", TOP + S * ROW);
  const maps = DATA.attention[DATA.layers.indexOf(layer)];
  const heads = head === "all" ? [...Array(H).keys()] : [head];
  let lines = 0;
  for (const h of heads) {
    for (let q = 0; q < S; q++) {
      for (let k = 0; k < S; k++) {
        const w = maps[h][q][k];
        if (w <= 0) continue;
        element("line", {x1: leftX + 5, y1: TOP + q * ROW - 4, x2: rightX - 5, y2: TOP + k * ROW - 4,
                         stroke: color(h), "stroke-width": 2, "stroke-opacity": w, "data-q": q, "data-k": k});
        lines++;
      }
    }
  }
  DATA.tokens.forEach((t, i) => {
    const cls = DATA.segments[i] ? "b" : "a";
    const left = element("text", {x: leftX, y: TOP + i * ROW, "text-anchor": "end", class: cls,
                                  "data-i": i, "data-side": "q"}, t);
    const right = element("text", {x: rightX, y: TOP + i * ROW, class: cls, "data-i": i, "data-side": "k"}, t);
    left.onmouseenter = () => focus("q", i);
    right.onmouseenter = () => focus("k", i);
    left.onmouseleave = right.onmouseleave = () => focus("q", -1);
  });
  document.getElementById("status").textContent =
      "rendered " + S + " tokens, layer " + layer + ", head " + head + ", " + lines + " lines";
}

layerSelect.onchange = () => select(layerSelect.value, headSelect.value);
headSelect.onchange = () => select(layerSelect.value, headSelect.value);
window.addEventListener("hashchange", render);
render();
</script>
</body></html>
"""


# ---------------------------------------------------------------------------------------------------- main

def inputs(cfg, tokenizer, records: list[dict], max_length: int = 128, path: str = "input") -> list[embed.Example]:
  """The records tokenized, truncated to `max_length` and to the position table; a ValueError naming `path`."""
  max_length = min(max_length, embed.longest_input(cfg))
  return embed.read_examples([json.dumps(r) for r in records], tokenizer, max_length, truncate=True, path=path,
                             cfg=cfg)


def compute(cfg, params, tokenizer, records: list[dict], max_length: int = 128, batch_size: int = 8,
            examples=None) -> list[Map]:
  """Every record's attention over all layers; `params` are the encoder's (a checkpoint's params["bert"]);
  `examples`: the records' `inputs` where already made."""
  examples = inputs(cfg, tokenizer, records, max_length) if examples is None else examples
  results = forward.encode(cfg, params, examples, batch_size=batch_size, output_attentions=True)
  maps = []
  for record, example, result in zip(records, examples, results):
    tokens = forward.tokens(tokenizer, example)
    maps.append(Map(describe(record, tokens), tokens, segments(tokenizer, record, example),
                    np.asarray(result["attentions"], np.float32)))
  return maps


def segments(tokenizer, record: dict, example) -> list[int]:
  """Each token's text of a pair, 0 or 1: the token type ids, or, where a family gives every token type 0
  (RoBERTa's `<s> A </s></s> B </s>`), 1 after the first separator of a pair's text."""
  types = [int(t) for t in example.token_type_ids]
  ids = [int(t) for t in example.input_ids]
  if any(types) or record.get("text_b") is None or tokenizer is None or tokenizer.sep_id not in ids:
    return types
  first = ids.index(tokenizer.sep_id)
  return [0] * (first + 1) + [1] * (len(ids) - first - 1)


def write_maps(output_dir: str, maps: list[Map], layers: list[int] | None = None,
               max_tokens: int = _MAX_TOKENS) -> None:
  """Writes attention_{i}.png/.html for each of `maps` (of `layers`; None: all) and index.html."""
  os.makedirs(output_dir, exist_ok=True)
  for i, m in enumerate(maps):
    shown = list(range(m.attentions.shape[0])) if layers is None else layers
    attentions = m.attentions[shown]
    plot_grid(attentions, m.tokens, os.path.join(output_dir, f"attention_{i}.png"), shown, max_tokens, m.title)
    page = page_html(page_data(attentions, m.tokens, m.segments, shown), m.title)
    with open(os.path.join(output_dir, f"attention_{i}.html"), "w", encoding="utf-8") as f:
      f.write(page)
  with open(os.path.join(output_dir, "index.html"), "w", encoding="utf-8") as f:
    f.write(index_html([(i, m.title) for i, m in enumerate(maps)]))


def main(argv) -> None:
  """`bert-jax analyze attention`: see the module docstring."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  values = flags.FLAGS
  # The checkpoint, the input, an --output_dir that cannot be made: one paragraph, exit 2.
  with failures.as_user_errors("bert-jax analyze attention", OSError, ValueError):
    paths.output_file(os.path.join(values.output_dir, "index.html"))   # makes the folder, before the work
    cfg, params, tokenizer = checkpoint_loader.load(values.checkpoint)
    layers = pick_layers(values.layers, cfg.num_layers)
    records = read_records(values.input)
    if not records:
      raise readers.DataError(f"{values.input} holds no input (see `bert-jax analyze attention --help`)")
    examples = inputs(cfg, tokenizer, records, values.max_length, path=values.input)
  maps = compute(cfg, params["bert"], tokenizer, records, values.max_length, values.batch_size, examples)
  write_maps(values.output_dir, maps, layers, values.max_tokens)
  print(f"wrote {len(maps)} inputs' attention maps (layers {layers}): {os.path.join(values.output_dir, 'index.html')}")
