"""The record rtserve reads through the ``rtserve.families`` entry point (pyproject.toml).

It imports nothing but the record type: the service, export and the command import each part only
when they use it. The family serves the classify task through rtserve's own classify pipeline (its
step graph keeps that pipeline's contract: ``memory``, ``input_ids``, ``attention_mask`` in;
``next_memory``, ``logits`` out), so ``/classify`` and classify sessions answer for it as they do for
RMT, and a document streamed in pieces equals the document posted whole.
"""

from models.families import CLASSIFY, Family

FAMILY = Family(
    name="gru-classifier",
    adapter="rtserve_gru_classifier.serving:servable",
    recipe="rtserve_gru_classifier.recipe",
    config="rtserve_gru_classifier.model:GRUConfig",
    model="rtserve_gru_classifier.model:GRUClassifier",
    **(CLASSIFY | {"evaluate": "rtserve_gru_classifier.scoring:score"}),
)
