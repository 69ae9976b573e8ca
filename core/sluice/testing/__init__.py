"""Test machinery shipped with sluice: fault injectors (and, later, the connector conformance kit).

The engine never imports this package; it knows fault injection only through
:class:`sluice.runtime.fault_hook.FaultHook`.
"""

from sluice.testing.faults import POINTS, FaultInjector, InjectedFault
from sluice.testing.spark_faults import SlotCrash, SparkFaultInjector

__all__ = ["POINTS", "FaultInjector", "InjectedFault", "SlotCrash", "SparkFaultInjector"]
