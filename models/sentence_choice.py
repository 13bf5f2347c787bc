"""Sentence copy (``decoding="sentence"``): which units of a document a summary copies, written whole, as the
document writes them. numpy only: the service, the salience head's fit and the tests share it.

The model's salience head (``models/salience_head.py``) gives every source token t a logit
a_t = w . e_t + b on the frozen encoder's output e_t; a copy unit (``models/copy_units.py``; a sentence
below) j of n, with tokens S_j, scores

    z_j = mean_{t in S_j} a_t + p_0 [j = 0] + p_1 / (1 + j) + p_2 j / n          (sentence score)

(the mean of a linear map is the map of the mean: a logistic regression on the sentence's mean encoder
output and its position). A head with a lexicon (``SRformerConfig.salience_lexical``) adds what the words
say: a weight v_x per WordPiece id x (so a_t gains v_{x_t}), and two terms of the sentence,

    + q_0 cos(f_j, f_D - f_j) + q_1 log(1 + |S_j|)                              (lexical terms)

where f_j is sentence j's WordPiece counts times their inverse document frequency (idf, counted on the
training documents) and f_D the whole text's: how central the sentence is to the rest of the document, and
its length.

The choice (:func:`choose_sentences`): the document's first unit opens the summary; then the
highest-scoring units are taken until the summary is as long as the model's summary length
(``summary_ratio`` of the tokens read, or ``summary_length``): a unit is taken when it brings the length
nearer that target, together with the units it leans on (:func:`leans_on`: the sentence its "He" or "But"
continues, the one that introduced the "Mr Kim" it names), and never when it repeats one already taken.
They are written in the document's order (:func:`copy_sentences`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from models.copy_units import DocumentText, open_quote
from models.sentences import words


def position_features(n: int) -> np.ndarray:
    """(n, 3): the position part of the sentence score, per sentence."""
    j = np.arange(n, dtype=np.float32)
    return np.stack([(j == 0).astype(np.float32), 1.0 / (1.0 + j), j / max(n, 1)], axis=1)


@dataclass(frozen=True)
class Lexicon:
    """The lexical part of a salience head: per WordPiece id, its weight v and its idf; ``weights`` (q) for
    the centrality and length terms (module docstring)."""

    token_weight: np.ndarray  # (vocab,) v_x
    idf: np.ndarray  # (vocab,)
    weights: tuple[float, float]  # q_0 (centrality), q_1 (length)

    def features(self, doc: DocumentText) -> np.ndarray:
        """(n, 2): per sentence, cos(f_j, f_D - f_j) and log(1 + |S_j|)."""
        return lexical_features(doc, self.idf)


def lexical_features(doc: DocumentText, idf: np.ndarray) -> np.ndarray:
    """(n, 2): the centrality and length terms of every sentence (0 and log 1 for one without tokens)."""
    n = len(doc.spans)
    kept = doc.sentence_of >= 0
    ids, sentence = doc.ids[kept], doc.sentence_of[kept]
    present, counts = np.unique(doc.ids, return_counts=True)
    f_d = np.zeros(len(idf))
    f_d[present] = counts * idf[present]
    d_squared = float(f_d @ f_d)
    out = np.zeros((n, 2))
    for j in range(n):
        own, own_counts = np.unique(ids[sentence == j], return_counts=True)
        if not len(own):
            continue
        f_j = own_counts * idf[own]
        overlap, j_squared = float(f_j @ f_d[own]), float(f_j @ f_j)
        # f_j . (f_D - f_j) / (|f_j| |f_D - f_j|), with |f_D - f_j|^2 = |f_D|^2 - 2 f_j . f_D + |f_j|^2
        rest_squared = max(d_squared - 2 * overlap + j_squared, 0.0)
        norm = np.sqrt(j_squared * rest_squared)
        out[j, 0] = (overlap - j_squared) / norm if norm > 0 else 0.0
        out[j, 1] = np.log1p(own_counts.sum())
    return out


def sentence_scores(doc: DocumentText, token_logits: np.ndarray, position_weights: Sequence[float],
                    lexicon: Lexicon | None = None) -> np.ndarray:
    """z_j for every sentence (module docstring); -inf for a sentence without a read token."""
    n = len(doc.spans)
    logits = np.asarray(token_logits, dtype=np.float64)[: len(doc.sentence_of)]
    if lexicon is not None:
        logits = logits + lexicon.token_weight[doc.ids[: len(logits)]]
    kept = doc.sentence_of >= 0
    sums = np.bincount(doc.sentence_of[kept], weights=logits[kept], minlength=n)
    counts = doc.tokens.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), -np.inf)
    z = mean + position_features(n).astype(np.float64) @ np.asarray(position_weights, dtype=np.float64)
    if lexicon is not None:
        z = z + lexicon.features(doc) @ np.asarray(lexicon.weights, dtype=np.float64)
    return z


# ---- what a copied unit leans on ------------------------------------------------------------------
# a unit that opens with one of these reads as the continuation of the unit before it
_OPENS_LEANING = frozenset(
    "he she they it his her their its him them this these those that such another both there but however also "
    "and yet so then still meanwhile instead nevertheless moreover furthermore besides thus hence therefore "
    "further despite subsequently conversely additionally indeed overall likewise similarly consequently "
    "accordingly nonetheless otherwise finally".split())
_OPENING_PHRASES = ("for example", "for instance", "in addition", "as a result", "in contrast", "in response",
                    "on the other hand", "at the same time", "by contrast", "in turn", "in particular", "for this",
                    "to this end", "to address this", "to address these", "in this way")
# a demonstrative before a noun anywhere in the unit ("... the virulence of these recombinants") points back
# like an opening one ("study" excepted: "these studies" of a review, "this study" of the article itself)
_POINTS_BACK = re.compile(r"(?<!^)\b(?:these|those)\s+(?!stud(?:y|ies)\b)[^\W\d_]{3,}", re.IGNORECASE)
# the second and later items of an enumeration ("Fourth, species of the genus ...", "Next, tissues were ...")
_ENUMERATES = re.compile(r"^\W*(?:second|secondly|third|thirdly|fourth|fifth|sixth|lastly|next)\s*,", re.IGNORECASE)
# a subject pronoun after a short opening phrase ("During cross examination, he asked ...", "Together, they
# have ..."): a phrase of up to four words, none capitalised but the first, is too short to name its antecedent
_PRONOUN_AFTER_OPENING = re.compile(r"^\W*[^\W\d_][\w'’-]*(?:\s+[a-z0-9][\w'’-]*){0,3}\s*,\s+(?:he|she|they)\b")
_FIRST_WORDS = re.compile(r"[A-Za-z']+(?:\s+[A-Za-z']+){0,3}")
_SPEAKS = (r"(?:said|says|added|adds|told|tells|argued|continued|warned|explained|insisted|claimed|stressed"
           r"|admitted|asked|replied|wrote)")
# a quotation given to a pronoun ("..., he said."), unless a titled name is in the unit too
_PRONOUN_SPEAKS = re.compile(r"\b(?:he|she|they)\s+" + _SPEAKS + r"\b", re.IGNORECASE)
_SPEAKER = re.compile(r"\b" + _SPEAKS + r"\b", re.IGNORECASE)
_OPENING_QUOTE = re.compile(r"^\s*[\"“]")
_TITLED_NAME = re.compile(r"\b(?:Mr|Mrs|Ms|Miss|Dr|Prof|Sir|Lord|Lady)\.?\s+([A-Z][\w'’-]+)")
_CAPITALISED = re.compile(r"(?<![\w'’-])([A-Z][\w'’-]+)")
_NAME_PAIR = re.compile(r"(?=\b([A-Z][\w'’-]+)\s+([A-Z][\w'’-]+))")  # overlapping: "Mary Queen Scots"


def _opens_leaning(unit: str) -> bool:
    opening = _FIRST_WORDS.search(unit)
    if opening is None:
        return False
    words = opening.group(0).lower().split()
    return words[0] in _OPENS_LEANING or any(" ".join(words).startswith(phrase) for phrase in _OPENING_PHRASES)


def leans_on(units: Sequence[str]) -> list[frozenset[int]]:
    """Per unit, the other units a reader needs to understand it (a reader takes a summary sentence that
    leans on a sentence left out for a non sequitur, or a quote for the wrong speaker's):

    - the unit before, when it opens with a pronoun, a demonstrative, a connective or a later item of an
      enumeration ("He", "These", "But", "For example", "Fourth,"), has a subject pronoun after a short opening
      phrase ("In his memoirs, he ..."), gives a quotation to a pronoun ("..., he said.") or is a quotation that
      names no speaker (news style gives a run of quoted paragraphs the speaker of the first);
    - the unit that introduced a name it uses alone: a surname after a title ("Mr Kim") or a capitalised word
      never preceded by another one here ("Faraj continued"), whose first appearance as the second of two
      capitalised words ("Mustafa Faraj", "James Hardie") was in an earlier unit;
    - the unit after, when it ends inside a quotation that the unit after carries on (news style runs a
      quotation over paragraphs, reopening it in each and closing it in the last): copied alone, the
      quotation would never close.

    Lower-cased text (SumPubMed's) has no names to follow; its connectives still count."""
    introduced: dict[str, int] = {}
    out = []
    for j, unit in enumerate(units):
        needs: set[int] = set()
        quotation = _OPENING_QUOTE.match(unit)  # its first word is the speaker's, not the narrator's
        if j and ((not quotation and (_opens_leaning(unit) or _POINTS_BACK.search(unit) or _ENUMERATES.search(unit)
                                      or _PRONOUN_AFTER_OPENING.search(unit)))
                  or (_PRONOUN_SPEAKS.search(unit) and not _TITLED_NAME.search(unit))
                  or (quotation and not _SPEAKER.search(unit))):
            needs.add(j - 1)
        seconds = {second for _, second in _NAME_PAIR.findall(unit)}
        alone = {word for word in _CAPITALISED.findall(unit) if word not in seconds} | set(_TITLED_NAME.findall(unit))
        needs.update(introduced[name] for name in alone if name in introduced)
        for name in seconds:
            introduced.setdefault(name, j)
        if j + 1 < len(units) and open_quote(unit) and _OPENING_QUOTE.match(units[j + 1]):
            needs.add(j + 1)
        out.append(frozenset(needs))
    return out


_STOP_WORDS = frozenset("the and for with from that this was were are been has have had not but which who its his "
                        "her their they said says will would also than into".split())
REPEATS = 0.6  # a unit with more than this share of its content words in one already taken repeats it


def _trigrams(unit: str) -> list[tuple[str, ...]]:
    """The word trigrams the repeated-trigram measure counts (``models.data.summary_quality``)."""
    tokens = [word.lower() for word in words(unit)]
    return [tuple(tokens[i : i + 3]) for i in range(len(tokens) - 2)]


def _content_words(unit: str) -> frozenset[str]:
    return frozenset(word for word in re.findall(r"[a-z0-9]+", unit.lower()) if len(word) > 2 and word not in
                     _STOP_WORDS)


def choose_sentences(doc: DocumentText, scores: np.ndarray, target_tokens: int,
                     limit_tokens: int | None = None, adjacency: float = 0.0,
                     trigram_overlap: float = 1.0) -> list[int]:
    """The units to copy, in document order.

    The document's first copy unit opens the summary (it introduces the story), then the others by score.
    A unit is taken together with what it leans on (:func:`leans_on`, followed through; a title or header it
    leans on is never copied) that is not taken yet, when that group brings the summary's token count nearer
    ``target_tokens`` (never past ``limit_tokens``), until the target is reached. A group that repeats a unit
    already taken (``REPEATS``) is passed over.

    ``adjacency`` > 0 ranks a unit next to one already taken as if it scored ``adjacency`` standard deviations
    of the document's scores more, so the summary runs in longer stretches of the document: fewer jumps
    between topics, at some cost in ROUGE (a model's choice, ``extras.decode.adjacency``).

    ``trigram_overlap`` < 1 passes over a group more than that share of whose word trigrams the summary already
    has: a head that favours the sentences dense in the document's key terms otherwise repeats its phrases
    from sentence to sentence (a model's choice, ``extras.decode.trigram_overlap``)."""
    order = [int(j) for j in np.argsort(-scores, kind="stable") if np.isfinite(scores[j]) and doc.copyable(int(j))]
    if order:
        order.insert(0, order.pop(order.index(min(order))))
    units = [doc.text[start:end] for start, end in doc.spans]
    # what a unit leans on and cannot be copied (a title, a header) is not brought: the reader never sees it
    needs = [frozenset(i for i in leaning if doc.copyable(i)) for leaning in leans_on(units)]
    words = [_content_words(unit) for unit in units]
    trigrams = [_trigrams(unit) for unit in units] if trigram_overlap < 1 else []
    taken_trigrams: set[tuple[str, ...]] = set()
    chosen: set[int] = set()
    total = 0
    finite = np.isfinite(scores)
    bonus = adjacency * float(np.std(scores[finite])) if adjacency and finite.sum() > 1 else 0.0
    pending = list(order)
    while pending:
        if total >= target_tokens:
            break
        pick = 0
        if bonus and chosen:
            keyed = [float(scores[k]) + bonus * ((k - 1 in chosen) or (k + 1 in chosen)) for k in pending]
            pick = int(np.argmax(keyed))
        j = pending.pop(pick)
        group, waiting = set(), [j]
        while waiting:
            k = waiting.pop()
            if k not in group and k not in chosen:
                group.add(k)
                waiting.extend(needs[k])
        if any(not np.isfinite(scores[k]) for k in group) or any(
                words[k] and len(words[k] & words[i]) > REPEATS * len(words[k]) for k in group for i in chosen):
            continue
        group_trigrams = [t for k in sorted(group) for t in trigrams[k]] if trigrams else []
        if group_trigrams and sum(t in taken_trigrams for t in group_trigrams) > trigram_overlap * len(group_trigrams):
            continue
        size = int(doc.tokens[sorted(group)].sum())
        if limit_tokens is not None and total + size > limit_tokens:
            continue
        if not chosen or abs(total + size - target_tokens) < abs(total - target_tokens):
            chosen |= group
            total += size
            taken_trigrams.update(group_trigrams)
    if not chosen:  # every sentence is too short to copy alone: the best one that fits (none may fit the limit)
        fitting = [int(j) for j in np.argsort(-scores, kind="stable") if np.isfinite(scores[j])
                   and (limit_tokens is None or doc.tokens[j] <= limit_tokens)]
        chosen = set(fitting[:1])
    return sorted(chosen)


def copy_sentences(text: str, tokenizer: object, token_logits: np.ndarray, tokens_read: int,
                   position_weights: Sequence[float], target_tokens: int,
                   max_length: int | None = None, lexicon: Lexicon | None = None,
                   adjacency: float = 0.0, trigram_overlap: float = 1.0) -> list[tuple[str, int]]:
    """Sentence copy of a document: the chosen sentences as the document writes them, with their token
    counts, in the document's order (``max_length`` caps the tokens; it also caps the target; ``adjacency``,
    ``trigram_overlap``: :func:`choose_sentences`)."""
    doc = DocumentText(text, tokenizer, tokens_read)
    scores = sentence_scores(doc, np.asarray(token_logits)[:tokens_read], position_weights, lexicon)
    target = min(target_tokens, max_length) if max_length else target_tokens
    chosen = choose_sentences(doc, scores, target, max_length or None, adjacency, trigram_overlap)
    return [(doc.sentence(j), int(doc.tokens[j])) for j in chosen]
