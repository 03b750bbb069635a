"""The web player's server side (``gradlab play``; docs/ARCHITECTURE.md section 12).

Modules and their public names:
    session: ``PlaybackSession`` (a checkpoint's weights-only policy on one lane of its goal's
        evaluation environment; per-step telemetry, episode reports), ``returns_to_go``,
        ``StepReport``, ``action_meanings``.
    worker: ``PlaybackWorker`` (a warm process that owns one session; the server never steps an
        environment itself), ``WorkerFailed``.
    catalog: ``Catalog`` (projects → goals → runs → checkpoints from the experiments tree and the
        configured stores; resolution and verification of checkpoints to play).
    protocol: every API payload and WebSocket message (pydantic), ``PROTOCOL_VERSION``, the binary
        frame header.
    replay: ``ReplaySession`` (a recorded dataset episode from its verified local copy: steps, frames
        decoded, re-simulated or absent), ``prepare_replay``, ``agent_label``, ``dataset_cache``;
        ``replay_socket``: the ``/api/replay`` WebSocket.
    human, human_socket: play a goal yourself (``HumanSession``, ``key_map``), the ``/api/human`` WebSocket.
    server: ``PlayConfig``, ``create_app`` (FastAPI), ``make_server`` / ``serve`` (uvicorn on
        127.0.0.1), ``bind_loopback``, ``web_player_root`` (the checkout's ``web_player/``, else the
        copy bundled in the wheel).

The browser code is ``web_player/`` (plain ES modules; GridStack and uPlot vendored).
"""
