"""Flow control: requests wait in the router, by priority and fair share, when their tier is full.

`policy` is the queue discipline (pure), `standing` a request's flow and priority (pure), `gate` the
asyncio shell that holds requests until a seat frees, `seats` how a free seat is read off the picker."""

from oculis_router.flowcontrol.gate import FlowControl, Shed, Ticket
from oculis_router.flowcontrol.policy import FlowQueues, Item
from oculis_router.flowcontrol.standing import BATCH_PRIORITY, PRIORITY_HEADER, PriorityRefused, Standing, standing

__all__ = ["BATCH_PRIORITY", "PRIORITY_HEADER", "FlowControl", "FlowQueues", "Item", "PriorityRefused", "Shed",
           "Standing", "Ticket", "standing"]
