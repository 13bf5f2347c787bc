"""Sentence spans: the unit of sentence-copy summaries and of the readability measures."""

from models.sentences import capitalised, is_uncased, sentence_spans, sentences

CASED = (
    "Ad sales boost Time Warner profit\n\n"
    "Quarterly profits at US media giant TimeWarner jumped 76% to $1.13bn (£600m) for the three months to "
    "December, from $639m year-earlier. Mr. Smith said \"it was good.\" The U.S. economy grew 3.5% in the "
    "year, said J. Smith! Did he? Yes.Growth was set to stabilise.China's economy grew. It was e.g. fine."
)


def test_cased_rules() -> None:
    assert sentences(CASED) == [
        "Ad sales boost Time Warner profit",
        "Quarterly profits at US media giant TimeWarner jumped 76% to $1.13bn (£600m) for the three months to "
        "December, from $639m year-earlier.",
        "Mr. Smith said \"it was good.\"",
        "The U.S. economy grew 3.5% in the year, said J. Smith!",
        "Did he?",
        "Yes.",
        "Growth was set to stabilise.",
        "China's economy grew.",
        "It was e.g. fine.",
    ]


def test_uncased_text_splits_before_lower_case_starts() -> None:
    text = ("BACKGROUND\nthe gene flow is high  <cit> . farmers grow gm crops, e.g. maize. it was  <dig> % fig. 2. "
            "in e. coli and s. cerevisiae it was low.")
    assert is_uncased(text)
    assert sentences(text) == ["BACKGROUND", "the gene flow is high  <cit> .", "farmers grow gm crops, e.g. maize.",
                               "it was  <dig> % fig. 2.", "in e. coli and s. cerevisiae it was low."]
    # a cultivar's and a species' abbreviations do not end a sentence
    assert sentences("petals from cv. rubens were used. strains of lactobacillus spp. and bifidobacterium sp. grew.") \
        == ["petals from cv. rubens were used.", "strains of lactobacillus spp. and bifidobacterium sp. grew."]


def test_spans_index_the_text() -> None:
    for start, end in sentence_spans(CASED):
        assert CASED[start:end] == CASED[start:end].strip() and CASED[start:end]


def test_capitalised() -> None:
    assert capitalised("the u.s. grew") == "The u.s. grew"
    assert capitalised("\"quoted\" start") == "\"Quoted\" start"
    assert capitalised("3 cases") == "3 cases"


def test_glued_sentences_of_bbc_references_are_split():
    text = ('Profit was $360m.Under the deal it grew in 1997.They said sales.GM agreed, said Idec."Most of it was '
            'fine," he said. The U.S. rate was 3.5% at bbc.co.uk today.')
    assert sentences(text) == ["Profit was $360m.", "Under the deal it grew in 1997.", "They said sales.",
                               "GM agreed, said Idec.", '"Most of it was fine," he said.',
                               "The U.S. rate was 3.5% at bbc.co.uk today."]
