"""The scenarios of ``rtserve bench``, one module per related group: :mod:`.classify` (``e2e``, ``throughput``,
``latency``), :mod:`.summarize` (``articles``, ``decode``), :mod:`.forecast` (``rsa``), :mod:`.floor`,
:mod:`.gpu`, :mod:`.triton` (rtserve beside Triton's sequence batcher) and :mod:`.sweep` (capacity); what they
share is in :mod:`.common`.
"""
