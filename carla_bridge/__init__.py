"""CARLA bridge: live CARLA client, recorder/replay and the detection task.

Not built yet (see the issue tracker); the package exists so the layout of DESIGN.md §2 is
stable from the first release.
"""
