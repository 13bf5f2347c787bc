"""A GRU long-document classifier as an rtserve family: ``family`` (the record rtserve reads), ``model`` (the
network and its segment step), ``serving`` (the step graph export writes), ``recipe`` (``rtserve train`` /
``rtserve eval <checkpoint>``) and ``scoring`` (``rtserve eval <exported entry>``)."""
