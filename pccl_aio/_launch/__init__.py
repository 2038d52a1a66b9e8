"""The launcher behind ``python -m pccl_aio.launch``: processes (``runner``, each a
``procs.Child``), what it keeps of a run (``record``) and what it writes at the end
(``report``); ``hold`` keeps a master up between the demo's phases."""
