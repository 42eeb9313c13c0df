"""Loss-surface and width analyses of the paper, as commands over saved runs.

Each module is a command (``python -m swalab.analysis.<name> --help``) that writes its data
(JSON lines while it works, ``.npz`` at the end) and a PNG next to it:

* ``plane``: train loss and test error in the plane through three weight vectors, with a run's
  checkpoints projected into it (Figs. 1, 3);
* ``rays``: along random unit directions from the SWA and SGD solutions (Fig. 4);
* ``segment``: along the line through SWA and SGD, beyond both ends (Fig. 5);
* ``curves``: test error against epoch for several runs (Figs. 6, 7).

Supporting modules: ``weights`` (state dicts as parameter vectors, BN buffers kept apart),
``probe`` (score one point, resumable result log), ``loading`` (a run's model, data, weights),
``plots`` (the figures)."""
