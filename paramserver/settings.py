"""The run's settings as the server reads them. The run config is declared above this
package (runconfig/settings.py's `RunConfig`, whose checks ask the rules and the reply
policy here about their own keys), so the server takes it by duck type: each `for_run`
reads the keys it names, and a rule's are listed in paramserver/rules/base.py's
`RuleSettings`. `Mode` lives here, the lowest layer that compares it, so every package
above names the modes by one enum."""
from enum import Enum
from typing import Any

RunSettings = Any  # a runconfig.settings.RunConfig, or anything with the keys a reader names


class Mode(str, Enum):
    """A run's `mode`. A str, so a config file, config.json and the flag read and write
    the words themselves, and a config's plain string compares equal to its member."""

    ASYNC = "async"          # a parameter server and asynchronous clients
    SYNC = "sync"            # the gradients averaged every step (allreduce)
    LOCAL_SGD = "local-sgd"  # the weights averaged every n_sync steps (an outer step: synchronous DiLoCo)

    def __str__(self) -> str:
        return self.value
