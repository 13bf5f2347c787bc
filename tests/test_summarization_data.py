"""The summarization corpora: folder detection, SumPubMed's clean reference, Lead-k."""

import json

import pytest

from models.data import bbc, sumpubmed
from models.data.summarization import corpus_of

ABSTRACT = """BACKGROUND
first background sentence. second one.

methods
we measured things.


RESULTS
the results were good.


CONCLUSIONS
it works, e.g. here.

keywords
geneflowrice© the author 2015
"""

ARTICLE = """BACKGROUND
alpha sentence one. alpha sentence two, e.g. with an abbreviation.
beta paragraph sentence.

RESULTS
gamma result <dig> %.
"""


@pytest.fixture
def sumpubmed_folder(tmp_path):
    (tmp_path / "text").mkdir()
    (tmp_path / "abstract").mkdir()
    for key in (7, 12):
        (tmp_path / "text" / f"text_{key}.txt").write_text(ARTICLE)
        (tmp_path / "abstract" / f"abstract_{key}.txt").write_text(ABSTRACT)
    (tmp_path / "splits.json").write_text(json.dumps({"train": [12], "dev": [], "test": [7]}))
    return tmp_path


def test_clean_reference_stops_after_the_conclusions_paragraph_and_drops_headers():
    clean = sumpubmed.clean_abstract(ABSTRACT)
    assert clean.splitlines() == [
        "first background sentence. second one.",
        "we measured things.",
        "the results were good.",
        "it works, e.g. here.",
    ]


def test_sumpubmed_split_document_and_lead(sumpubmed_folder):
    assert corpus_of(sumpubmed_folder) is sumpubmed
    (pair,) = sumpubmed.load_split(sumpubmed_folder, "test")
    assert pair.key == "7"
    assert "BACKGROUND" not in pair.document and "RESULTS" not in pair.document
    assert sumpubmed.sentences(pair.document) == [
        "alpha sentence one.",
        "alpha sentence two, e.g. with an abbreviation.",
        "beta paragraph sentence.",
        "gamma result <dig> %.",
    ]
    assert sumpubmed.lead(pair, 2) == "alpha sentence one. alpha sentence two, e.g. with an abbreviation."
    assert sumpubmed.all_keys(sumpubmed_folder) == ["7", "12"]


def test_corpus_detection_names_both_layouts_when_neither_matches(tmp_path):
    (tmp_path / bbc.ARTICLES).mkdir()
    assert corpus_of(tmp_path) is bbc
    with pytest.raises(ValueError, match="SumPubMed"):
        corpus_of(tmp_path / "missing")
