"""The run's settings as the server reads them. The run config is declared above this
package (runconfig/settings.py's `RunConfig`, whose checks ask the rules and the reply
policy here about their own keys), so the server takes it by duck type: each `for_run`
and `from_config` reads the keys it names. A run's server reads it once, into
paramserver/state.py's `StateSettings` (a rule's keys: paramserver/rules/base.py's
`RuleSettings`). The modes are rundir/modes.py's `Mode`, the lowest layer that compares
them (the plots do too)."""
from typing import Any

RunSettings = Any  # a runconfig.settings.RunConfig, or anything with the keys a reader names
