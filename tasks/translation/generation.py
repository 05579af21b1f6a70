"""Generated token ids -> text and lengths, and whether case can be scored.

In:  ``generate()``'s padded id rows (decoder start first), the end and pad token ids, the tokenizer.
Out: tokens generated per row up to the first end token (``gen_len``), which rows stopped at the length
     limit rather than ending, detokenised hypotheses, and whether the tokenizer lowercases (then BLEU/chrF are
     case-insensitive).
"""

from __future__ import annotations

import numpy as np


def tokenizer_lowercases(tokenizer) -> bool:
    """True when the tokenizer maps case away (uncased WordPiece), so case cannot be scored."""
    return tokenizer.tokenize("Translation Of The Day") == tokenizer.tokenize("translation of the day")


def generated_lengths(generated: np.ndarray, eos_token_id: int | list[int] | None, pad_token_id: int) -> np.ndarray:
    """Tokens generated per row after the decoder start (position 0), up to and including the first end token.

    Finished beams are filled with pad, or with the end token when pad is 0 (generate() picks
    ``pad_token_id or eos_token_id``), so counting non-pad tokens would overcount.
    """
    body = generated[:, 1:]
    eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    is_end = np.isin(body, eos) if eos else np.zeros(body.shape, dtype=bool)
    until_pad = (body != pad_token_id).sum(axis=1)
    first_end = np.where(is_end.any(axis=1), is_end.argmax(axis=1) + 1, until_pad)
    return first_end


def cut_generations(gen_lens: np.ndarray, generated: np.ndarray, eos_token_id: int | list[int] | None,
                    max_new_tokens: int, forced_eos_token_id: int | list[int] | None) -> np.ndarray:
    """Rows that stopped because they reached ``max_new_tokens``, not because the model ended them.

    ``gen_lens`` is :func:`generated_lengths` of ``generated``. A row that reached the limit without an end
    token is cut. One whose end token falls exactly at the limit is cut too when ``forced_eos_token_id`` is
    set (Marian, BART): generate() forces that token at the last step, so it says nothing about the model.
    """
    eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    ended = np.isin(generated[:, 1:], eos).any(axis=1) if eos else np.zeros(len(generated), dtype=bool)
    reached = gen_lens >= max_new_tokens
    return reached & ~ended if forced_eos_token_id is None else reached


def decode(tokenizer, generated: np.ndarray) -> list[str]:
    """Token ids (padded rows) -> detokenised strings, special tokens dropped, spaces cleaned up where :func:`cleans_up_spaces`."""
    texts = tokenizer.batch_decode(generated.tolist(), skip_special_tokens=True,
                                   clean_up_tokenization_spaces=cleans_up_spaces(tokenizer))
    return [text.strip() for text in texts]


def cleans_up_spaces(tokenizer) -> bool:
    """Whether decoding removes the spaces before punctuation (``" !"`` -> ``"!"``, ``"it ' s"`` -> ``"it's"``).

    For a WordPiece vocabulary (BERT2BERT) only: its pieces carry no spaces, so every piece is decoded with one
    before it and the clean-up restores the text. A SentencePiece or byte-level vocabulary holds its spaces in its
    pieces (``▁!`` is the model's choice of `` !``): cleaning up there rewrote an exactly generated ``oui !`` as ``oui!``.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and type(backend.model).__name__ == "WordPiece"
