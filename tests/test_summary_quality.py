"""The reader's measures of a summary and the extractive baselines, on hand-made text with known answers."""

import random

import pytest

from models.data.baselines import SentenceExtractor, greedy_oracle, lead, lead_of_length, sentence_labels
from models.data.summary_quality import (
    cased_as_source,
    reader_measures,
    trigram_repeats,
    verbatim_sentences,
    words,
)


def test_words_keep_inner_punctuation_and_drop_the_rest():
    assert words("Stuart's e-mail: prices fell 0.7% to 1,000 (U.S).") == [
        "Stuart's", "e-mail", "prices", "fell", "0.7", "to", "1,000", "U.S"]


def test_a_trigram_repeated_in_other_case_counts_once_per_repeat():
    assert trigram_repeats("The cat sat. the cat sat.") == (1, 4)
    assert trigram_repeats("we investigated. we investigated. we investigated.") == (2, 4)
    assert trigram_repeats("one two") == (0, 0)


def test_verbatim_sentences_ignore_spacing_and_respect_word_boundaries():
    source = "House prices fell by 0.7% in May.  Sales  rose.\nThe bank said so, she said."
    summary = "Sales rose. The bank said so, she said. House Prices fell by 0.7% in May. Prices rose by 0.7%."
    # found as written: the first two; found ignoring case: also the third; the fourth is not in the source
    assert verbatim_sentences(summary, source) == (2, 3, 4)
    # "he said." sits inside "she said.": not the same sentence
    assert verbatim_sentences("He said.", "And she said.") == (0, 0, 1)
    # a copied sentence opens with a capital, in cased text or in lower-cased text; only its first letter
    assert verbatim_sentences("The bank said so.", "and the bank said so.") == (1, 1, 1)
    assert verbatim_sentences("The Bank said so.", "and the bank said so.") == (0, 1, 1)
    assert verbatim_sentences("5 Pools.", "in 5 pools.") == (0, 1, 1)  # a digit opens it: no capital to forgive


def test_cased_as_source_judges_words_the_source_has_and_sentence_starts():
    source = "The BBC said house prices fell. House Prices index rose."
    # bbc: wrong (the source writes BBC, and a sentence opens with a capital); 0.7 and zebra: not judged;
    # Prices opening a sentence: right
    assert cased_as_source("bbc said house prices fell 0.7 zebra. Prices rose.", source) == (6, 7)
    assert cased_as_source("The BBC said house prices fell. House prices rose.", source) == (9, 9)
    assert cased_as_source("the BBC said so.", source) == (2, 3)  # "the" opens a sentence; "so": not judged


def test_an_uncased_source_lets_a_sentence_open_either_way():
    source = "the bbc said prices fell. results follow."
    assert cased_as_source("The bbc said prices fell.", source) == (5, 5)
    assert cased_as_source("the BBC said prices fell.", source) == (4, 5)


def test_reader_measures_pool_counts_and_average_the_length_ratio():
    sources = ["A b c d. E f g h.", "Q r s t."]
    scores = reader_measures(["A b c d.", "Q r s t. Q r s t."], sources, ["A b c d e f g h", "Q r s t"])
    assert scores["length_ratio"] == pytest.approx((4 / 8 + 8 / 4) / 2)
    assert scores["repeated_trigrams"] == pytest.approx(2 / (2 + 6))  # "q r s", "r s t" repeat
    assert scores["verbatim_sentences"] == 1.0
    assert scores["summary_words"] == 6.0
    assert reader_measures([""], ["A b."])["repeated_trigrams"] is None  # nothing counted: no share


DOCUMENT = "One two three. Four five. Six seven eight nine. Ten."


@pytest.mark.parametrize(("target", "expected"), [
    (0, ""),
    (3, "One two three."),
    (4, "One two three. Four five."),
    (5, "One two three. Four five."),
    (6, "One two three. Four five. Six seven eight nine."),
    (100, DOCUMENT),
])
def test_the_same_length_lead_is_the_shortest_run_of_sentences_that_reaches_the_length(target, expected):
    assert lead_of_length(DOCUMENT, target) == expected


def test_lead_k_is_the_first_k_sentences():
    assert lead(DOCUMENT, 2) == "One two three. Four five."


def test_labels_of_an_extractive_reference_are_the_sentences_it_holds():
    parts = ["It will stabilise.", "Rates fell.", "China's currency is weak."]
    assert sentence_labels(parts, "It will stabilise.China's currency is weak.") == [1, 0, 1]


def test_an_abstract_is_labelled_by_the_greedy_rouge_oracle():
    parts = ["alpha beta gamma.", "delta epsilon.", "zeta eta theta iota kappa."]
    # the first sentence holds most of the abstract; adding the third would lower ROUGE-1 + ROUGE-2
    assert greedy_oracle(parts, "alpha beta gamma zeta") == [0]
    assert sentence_labels(parts, "alpha beta gamma zeta") == [1, 0, 0]


FILLER = ("market officials river season board report city plan office growth team figure week policy "
          "station museum garden project").split()


def _toy_document(rng: random.Random) -> tuple[str, str]:
    """Six sentences of filler; the one about a verdict (at a random place) is the summary."""
    parts = [" ".join(rng.choice(FILLER) for _ in range(6)).capitalize() + "." for _ in range(5)]
    key = f"The jury returned a verdict of {rng.choice(FILLER)} guilty."
    parts.insert(rng.randrange(6), key)
    return " ".join(parts), key


def test_the_extractor_learns_which_sentences_a_summary_takes():
    rng = random.Random(0)
    training = [_toy_document(rng) for _ in range(40)]
    extractor = SentenceExtractor().fit([d for d, _ in training], [s for _, s in training])
    for document, key in (_toy_document(rng) for _ in range(10)):
        assert extractor.summarize(document, len(words(key))) == key
    # asked for more, it adds sentences and keeps them in the document's order
    document, key = _toy_document(rng)
    first, second = extractor.summarize(document, len(words(key)) + 1).split(". ")
    assert key in (f"{first}.", second) and 0 <= document.index(first) < document.index(second)


def test_the_extractor_refuses_labels_of_one_kind():
    with pytest.raises(ValueError, match="both in and out"):
        SentenceExtractor().fit(["A b c. D e f."], ["G h i."])


def test_the_oracle_takes_a_one_word_sentence_for_a_one_word_reference():
    assert greedy_oracle(["Yes.", "No way at all."], "yes") == [0]  # no bigram anywhere: ROUGE-2 is 0, not 0 / 0
