"""Input embeddings: token + segment (token type) + position, then LayerNorm and dropout.

In: ``input_ids`` (batch, seq) and optionally ``token_type_ids`` (batch, seq) and ``position_ids``.
Out: (batch, seq, hidden_size) vectors, the input of the first encoder/decoder layer.

Positions are either a learned table (BERT) or the fixed code of Vaswani et al. (2017):

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))
"""

import math

import torch
from torch import nn


def sinusoidal_position_encoding(position_ids: torch.Tensor, d_model: int) -> torch.Tensor:
    """Sin/cos position code for integer positions of any shape; returns shape (*position_ids.shape, d_model).

    Computed on the fly rather than stored: the cost is negligible next to attention and the model then
    has no non-persistent buffer that would need rebuilding after ``from_pretrained`` on the meta device.
    """
    # 10000^(-2i/d) written as exp(-2i·ln(10000)/d) for numerical stability, as in the reference code.
    two_i = torch.arange(0, d_model, 2, device=position_ids.device, dtype=torch.float32)
    inverse_frequency = torch.exp(-two_i * (math.log(10000.0) / d_model))
    angles = position_ids.to(torch.float32).unsqueeze(-1) * inverse_frequency
    encoding = torch.zeros(*position_ids.shape, d_model, device=position_ids.device, dtype=torch.float32)
    encoding[..., 0::2] = torch.sin(angles)
    # For odd d_model the last sin column has no cos partner.
    encoding[..., 1::2] = torch.cos(angles[..., : d_model // 2])
    return encoding


class Embeddings(nn.Module):
    """Sum of token, segment and position embeddings, optionally scaled, normalised and dropped out.

    ``type_vocab_size=0`` drops the segment embedding (the encoder-decoder has no segments);
    ``scale=True`` multiplies token embeddings by √hidden_size (the Transformer paper);
    ``use_norm=False`` skips the LayerNorm (the Transformer paper has none here, BERT has one).
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        max_position_embeddings: int,
        type_vocab_size: int,
        position_embedding: str,
        layer_norm_eps: float,
        dropout: float,
        pad_token_id: int | None = None,
        scale: bool = False,
        use_norm: bool = True,
    ):
        super().__init__()
        self.hidden_size = hidden_size
        self.position_embedding = position_embedding
        self.scale = math.sqrt(hidden_size) if scale else 1.0
        self.token_embeddings = nn.Embedding(vocab_size, hidden_size, padding_idx=pad_token_id)
        self.segment_embeddings = nn.Embedding(type_vocab_size, hidden_size) if type_vocab_size > 0 else None
        if position_embedding == "learned":
            self.position_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
        elif position_embedding == "sinusoidal":
            self.position_embeddings = None
        else:
            raise ValueError(f"position_embedding must be 'learned' or 'sinusoidal', got {position_embedding!r}")
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps) if use_norm else None
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        past_length: int = 0,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.token_embeddings(input_ids)
        batch_size, seq_length = inputs_embeds.shape[:2]
        if position_ids is None:
            # During cached decoding only the new tokens come in; their positions continue after the cache.
            position_ids = torch.arange(past_length, past_length + seq_length, device=inputs_embeds.device)
            position_ids = position_ids.unsqueeze(0).expand(batch_size, -1)

        embeddings = inputs_embeds * self.scale
        if self.segment_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros((batch_size, seq_length), dtype=torch.long, device=inputs_embeds.device)
            embeddings = embeddings + self.segment_embeddings(token_type_ids)
        if self.position_embeddings is not None:
            embeddings = embeddings + self.position_embeddings(position_ids)
        else:
            embeddings = embeddings + sinusoidal_position_encoding(position_ids, self.hidden_size).to(embeddings.dtype)

        if self.norm is not None:
            embeddings = self.norm(embeddings)
        return self.dropout(embeddings)
