"""``omni-bench``: how much load a fleet holds within a latency target.

Streams chat, speech, transcription and realtime voice turns at a router or a worker (or at a
fleet it starts itself, ``--local-workers N``), open loop (Poisson arrivals at each of a list of
rates) or closed loop (a list of concurrencies), and writes a terminal table, a JSON file of
every request and an HTML report with plots.

    settings.py   the flags (every one also an OMNI_BENCH_ variable)
    prompts.py    the built-in prompt set and JSONL prompt files
    playback.py   a simulated real-time player: first audible chunk, underruns
    workloads.py  one request of each kind, measured
    loadgen.py    levels of offered load: arrivals, concurrency, warm-up, progress
    report.py     figures per level, the table, JSON and HTML
    cli.py        the console script
"""
