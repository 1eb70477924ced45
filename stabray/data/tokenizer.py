"""The embedded model's word-level tokenizer, built with `tokenizers` from the task's own text.

Every number (0.197, 12), word, bracket, comma, colon and '|' is one token; whitespace separates
tokens and is not itself a token. Nothing is downloaded. The tokenizer is wrapped as a
`PreTrainedTokenizerFast`, so the embedded and the pretrained paths share one API and it saves
beside the model checkpoint.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from stabray.tasks.base import TOKEN_RE

PRE_TOKEN_PATTERN = TOKEN_RE.pattern  # one source of truth with normalize_answer()
SPECIALS = {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>"}
LATENT_TOKENS = ("<bot>", "<eot>", "<latent>")  # Coconut's markers; reserved for every model
N_INTEGERS = 128  # integers 0..127 are always in the vocabulary (node ids of larger graphs)


def pre_tokens(text: str) -> list[str]:
    return TOKEN_RE.findall(text)


def build_tokenizer(texts: Iterable[str]):
    """A word-level tokenizer whose vocabulary is the specials, the integers 0..127 and every
    pre-token seen in `texts` (in order of frequency, so ids are deterministic for fixed data)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    counts: Counter[str] = Counter()
    for t in texts:
        counts.update(pre_tokens(t))
    vocab: dict[str, int] = {}
    for tok in [
        *SPECIALS.values(),
        *LATENT_TOKENS,
        *(str(i) for i in range(N_INTEGERS)),
        *sorted(counts, key=lambda k: (-counts[k], k)),
    ]:
        vocab.setdefault(tok, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIALS["unk_token"]))
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Split(Regex(PRE_TOKEN_PATTERN), behavior="isolated"),
        ]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tk, additional_special_tokens=list(LATENT_TOKENS), **SPECIALS)
