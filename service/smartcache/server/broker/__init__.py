"""The broker: one thread, the client and worker sockets, one event loop (:mod:`.broker`).

:mod:`.intake` (the door in: validate, refuse, queue), :mod:`.replies` (the door out:
send, count), :mod:`.dispatch` (worker slots, answers, the watchdog), :mod:`.queue`
(the fixed-capacity priority queue), :mod:`.inproc` (the broker–worker protocol).
It never imports the workers, the handlers or storage.
"""
