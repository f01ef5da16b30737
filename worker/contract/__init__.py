"""The pipeline's contract, the bottom of the worker's stack: the ``Pipeline`` protocol the HTTP
side drives (``pipeline``: requests, events, status), how tokens are picked (``sampling``), what
a reply must be (``grammar``), the endpoints' options (``options``) and what a stage process
knows of its stage (``stage_context``). It imports nothing of the worker."""
