"""Where the step runs: placement over processes, saving, resuming and stopping under each placement.

The placement (one process, DDP, FSDP2 or DeepSpeed ZeRO; ``distributed``), the FSDP2 units and gathers
(``fsdp``), the ZeRO engine (``zero``), the optimizer (``optim``), saving and resuming under each placement
(``run_state``, ``checkpoint``), what stops a run early (``stopping``: NaN/inf steps, stop signals), and a
CPU run's threads (``threads``) and allocator/attention settings (``cpu_runtime``)."""

from grpokit.parallel.distributed import PreparedPolicy, make_accelerator, placement, prepare_policy
from grpokit.parallel.run_state import RunState
from grpokit.parallel.threads import ThreadPolicy

__all__ = ["PreparedPolicy", "RunState", "ThreadPolicy", "make_accelerator", "placement", "prepare_policy"]
