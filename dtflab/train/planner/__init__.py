"""The planner: how a transformer's training fits and how fast it runs, at any size, over
many devices. ``device_memory`` (the bytes each device holds, by kind: ``Plan``, ``PRESETS``),
``step_time`` (one step's seconds, by part), ``hardware`` (devices and links: presets, or
measured here by ``calibration``), ``search`` (every layout over N devices, each a ``Row``),
``published`` (the published runs the planner is checked against) and ``plans``, the front
door (``dtflab.plan``). Pure Python but ``calibration``, which runs a loop on a cluster."""
