"""The embedded model's word-level tokenizer, built with `tokenizers` from the task's own text.

Every number (0.197, 12), word, bracket, comma, colon and '|' is one token; whitespace separates
tokens and is not itself a token. With `numbers="digits"` every number is one token per character
instead (a WordPiece model: `52134` -> `5 ##2 ##1 ##3 ##4`, `0.25` -> `0 ##. ##2 ##5`, decoded back
to whole numbers). Nothing is downloaded. The tokenizer is wrapped as a
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


def reads_every_number(vocab: dict[str, int]) -> bool:
    """Whether a built vocabulary is numbers="digits"'s: every number is digit pieces, all in it."""
    return DIGIT_PIECES[-1] in vocab


def unknown_tokens(tokenizer, texts: Iterable[str]) -> Counter[str]:
    """Each piece of `texts` that `tokenizer` (one `build_tokenizer` made) reads as its unknown token,
    with how often: the built vocabulary holds only what its texts held (and 0..127 with numbers
    "word"), so a number or word that appears later (a fresh training split, another size) would reach
    the model as `<unk>`. Read off the pre-tokens (a set lookup: fast enough for every epoch's
    split); a text with characters no pre-token covers is encoded instead. Empty for a tokenizer
    without an unknown token (a byte-level pretrained one)."""
    found: Counter[str] = Counter()
    unk = tokenizer.unk_token_id
    if unk is None:
        return found
    vocab = tokenizer.get_vocab()
    digits = reads_every_number(vocab)
    specials = [t for t in tokenizer.all_special_tokens if t]  # <bos>, Coconut's <latent>, ...: whole tokens
    for text in texts:
        for sp in specials:
            if sp in text:
                text = text.replace(sp, " ")
        toks = pre_tokens(text)
        if sum(map(len, toks)) != sum(map(len, text.split())):  # e.g. a non-ASCII letter: the tokenizer's reading
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            found.update(text[a:b] for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if i == unk)
            continue
        found.update(t for t in toks if t not in vocab and not (digits and t[0].isdigit()))
    return found


# numbers="digits": the only number pieces, a leading digit and "##"-continued digits and '.'
DIGIT_PIECES = (*"0123456789", *(f"##{c}" for c in "0123456789."))
NUMBERS = ("word", "digits")


def build_tokenizer(texts: Iterable[str], numbers: str = "word"):
    """A tokenizer whose vocabulary is the specials, the numbers and every other pre-token seen in
    `texts` (in order of frequency, so ids are deterministic for fixed data). numbers="word": the
    integers 0..127 and every number seen are one token each; numbers="digits": a number is one
    token per character (WordPiece pieces, DIGIT_PIECES)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if numbers not in NUMBERS:
        raise ValueError(f"numbers must be one of {', '.join(NUMBERS)}, got {numbers!r}")
    counts: Counter[str] = Counter()
    for t in texts:
        counts.update(pre_tokens(t))
    by_freq = sorted(counts, key=lambda k: (-counts[k], k))
    vocab: dict[str, int] = {}
    if numbers == "digits":
        words = [k for k in by_freq if not k[0].isdigit()]
        for tok in [*SPECIALS.values(), *LATENT_TOKENS, *DIGIT_PIECES, *words]:
            vocab.setdefault(tok, len(vocab))
        tk = Tokenizer(models.WordPiece(vocab=vocab, unk_token=SPECIALS["unk_token"], max_input_chars_per_word=100))
        tk.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    else:
        for tok in [*SPECIALS.values(), *LATENT_TOKENS, *(str(i) for i in range(N_INTEGERS)), *by_freq]:
            vocab.setdefault(tok, len(vocab))
        tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIALS["unk_token"]))
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Split(Regex(PRE_TOKEN_PATTERN), behavior="isolated"),
        ]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tk, additional_special_tokens=list(LATENT_TOKENS), **SPECIALS)
