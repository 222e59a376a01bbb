"""CARLA bridge: the frame schema, box formats, replay of recorded drives and the recorder.

* :mod:`carla_bridge.frames`: the one schema every frame source yields.
* :mod:`carla_bridge.boxes`: VOC/YOLO box files ↔ ``xyxy`` pixel boxes.
* :mod:`carla_bridge.replay`: :class:`~carla_bridge.replay.ReplaySource`, recorded frames
  streamed per client and window without a simulator.
* :mod:`carla_bridge.recorder`: :class:`~carla_bridge.recorder.FrameRecorder`, any source's
  frames written back in the shared dataset's layout.

The live CARLA client and the detection task are not built yet; importing this package
imports none of its modules (no side effects, no simulator needed).
"""
