"""Attention heatmaps: what each head of each layer attends to in one sentence.

In: a model folder (a saved bertpipe_bert or bertpipe_transformer run, or a transformers BERT checkpoint)
with its tokenizer, a sentence and an output folder.
Out: one PNG per layer, ``layer_01.png`` ..., each a grid of heads; cell (i, j) of a head is the weight
with which token i (row, query) attends to token j (column, key). Returns the written paths.

For encoder-decoder models the encoder's self-attention is drawn (the sentence is the source).
transformers' own models are loaded with eager attention, since fused kernels do not return weights.
"""

import json
import math
from pathlib import Path

import torch


def _load(model_dir: str):
    import transformers
    from transformers import AutoModel, AutoTokenizer

    import models  # registers bertpipe_* with the Auto classes

    folder = Path(model_dir)
    if (folder / "config.yaml").is_file() and not (folder / "metrics.json").is_file() and not (folder / "config.json").is_file():
        raise ValueError(f"{model_dir} holds no finished run (no metrics.json, no model): its training was interrupted or "
                         f"failed; finish it with `bertpipe train {folder / 'config.yaml'} train.resume_from_checkpoint=latest`")
    if (folder / "export.json").is_file() or (folder / "adapter_config.json").is_file():
        kind = "an ONNX export (no attention weights come out of it)" if (folder / "export.json").is_file() else \
            "a peft adapter run: fold it into a full model first, `bertpipe merge RUN_DIR`, and draw RUN_DIR/merged"
        raise ValueError(f"{model_dir} is {kind}")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    load_kwargs = {} if config.get("model_type", "").startswith("bertpipe_") else {"attn_implementation": "eager"}
    # The saved class (head included) loads without missing/unexpected weights; heads return attentions too.
    architecture = (config.get("architectures") or [""])[0]
    model_class = getattr(models, architecture, None) or getattr(transformers, architecture, None) or AutoModel
    model = model_class.from_pretrained(model_dir, **load_kwargs).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer


@torch.no_grad()
def sentence_attentions(model, tokenizer, sentence: str) -> tuple[list[str], list[torch.Tensor]]:
    """Tokens of ``sentence`` and per-layer attention weights, each (heads, seq, seq)."""
    from pipelines.graphemes import is_blank
    from pipelines.modeling import usable_positions

    if is_blank(sentence):
        raise ValueError("the sentence is empty: give the text whose attention to draw")
    encoded = tokenizer(sentence, return_tensors="pt", verbose=False)  # a sentence too long is refused below
    # Positions a token can take: RoBERTa-style models skip two; XLNet's -1 (and T5's none) is no limit.
    # An encoder-decoder's limit is its encoder's (the sentence goes to the encoder alone).
    config = model.config.encoder if getattr(model.config, "model_type", None) == "encoder-decoder" else model.config
    positions = usable_positions(config)
    if positions is not None and encoded["input_ids"].shape[1] > positions:
        raise ValueError(f"the sentence is {encoded['input_ids'].shape[1]} tokens, past the model's {positions} usable positions "
                         f"(max_position_embeddings={config.max_position_embeddings})")
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
    if getattr(model.config, "is_encoder_decoder", False):
        outputs = model.get_encoder()(
            input_ids=encoded["input_ids"], attention_mask=encoded.get("attention_mask"), output_attentions=True
        )
    else:
        outputs = model(**encoded, output_attentions=True)
    if not outputs.attentions or outputs.attentions[0] is None:
        raise RuntimeError(f"{type(model).__name__} returned no attention weights")
    layers = [layer[0].float().cpu() for layer in outputs.attentions]
    if any(layer.shape[-2:] != (len(tokens), len(tokens)) for layer in layers):
        # Longformer returns each token's weights over its local window (heads, seq, 2w + 1): drawn as token to token,
        # the columns were window offsets under token labels.
        raise RuntimeError(f"{type(model).__name__} returned attention of shape {tuple(layers[0].shape)}, not token to token "
                           f"({len(tokens)} x {len(tokens)}): there is no heatmap of it to draw")
    return tokens, layers


def draw_layer(weights: torch.Tensor, tokens: list[str], title: str, path: Path) -> Path:
    """Write one layer's heads (heads, seq, seq) as a grid of heatmaps to ``path``."""
    # Figure + Agg canvas directly: no pyplot, so no GUI backend and no global figure state.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    num_heads, seq_len = weights.shape[0], weights.shape[-1]
    cols = math.ceil(math.sqrt(num_heads))
    rows = math.ceil(num_heads / cols)
    cell = max(2.5, 0.28 * seq_len)
    fig = Figure(figsize=(cols * cell, rows * cell + 0.6))
    FigureCanvasAgg(fig)
    font = max(4, min(9, int(160 / max(seq_len, 1))))
    for head in range(num_heads):
        ax = fig.add_subplot(rows, cols, head + 1)
        ax.imshow(weights[head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(f"head {head + 1}", fontsize=font + 1)
        ax.set_xticks(range(seq_len))
        ax.set_yticks(range(seq_len))
        ax.set_xticklabels(tokens, rotation=90, fontsize=font)
        ax.set_yticklabels(tokens, fontsize=font)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def attention_heatmaps(model_dir: str, sentence: str, out_dir: str) -> list[Path]:
    """Write ``layer_XX.png`` heatmaps of every layer's heads for ``sentence`` into ``out_dir``."""
    model, tokenizer = _load(model_dir)
    tokens, attentions = sentence_attentions(model, tokenizer, sentence)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    width = max(2, len(str(len(attentions))))
    return [
        draw_layer(weights, tokens, f"layer {index}: rows attend to columns", out / f"layer_{index:0{width}d}.png")
        for index, weights in enumerate(attentions, start=1)
    ]
