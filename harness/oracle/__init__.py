"""The harness's own model of what vLLM's offloading should do, request by request.

Pure Python and the standard library only, never vLLM's code: a run is judged by it, so
a bug in vLLM cannot hide in it. ``scheduler.py`` holds the offloading connector's rules
(what a request hits, loads and stores, per KV-cache group and family), ``workload.py``
draws the sequences it is judged on, ``shrink.py`` cuts a failing sequence short.
"""
