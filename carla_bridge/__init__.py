"""CARLA bridge: live CARLA client, recorder/replay and the detection task.

Built so far: the frame schema (``frames``), the live source (``live``, ``live_rig``) and
its ground truth (``projection``, ``segmentation``); ``carla`` is imported only when a live
drive starts. Recorder/replay and the detection task are still to come.
"""
