"""CARLA bridge: driving frames from a replay or a live simulator, and the detection task.

* :mod:`carla_bridge.frames`: the one schema every frame source yields.
* :mod:`carla_bridge.boxes`: VOC/YOLO box files ↔ ``xyxy`` pixel boxes.
* :mod:`carla_bridge.replay`: :class:`~carla_bridge.replay.ReplaySource`, recorded frames
  streamed per client and window without a simulator.
* :mod:`carla_bridge.live`: :class:`~carla_bridge.live.LiveSource`, a synchronous CARLA drive
  (``live_rig``: its actors) with ground truth from ``projection`` and ``segmentation``.
* :mod:`carla_bridge.recorder`: :class:`~carla_bridge.recorder.FrameRecorder`, any source's
  frames written back in the shared dataset's layout.
* :mod:`carla_bridge.detector`, :mod:`carla_bridge.detection`: the detector, its loss,
  decoding and COCO mAP (the detection objective).
* :mod:`carla_bridge.stream`: the ``carla-det`` / ``carla-highway`` / ``carla-live`` streams.
* :mod:`carla_bridge.demo_page`: the demo's HTML page.

Importing this package imports none of its modules (no side effects); ``carla`` is imported
only when a live drive starts.
"""
