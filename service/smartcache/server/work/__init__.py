"""The workers: slots served by event loops (:mod:`.workers`), and one message's execution
from its body to its answer (:mod:`.execute`). Exactly one answer per message, by construction."""
