# Tarantool's JSON log lines with the service's keys (issue 13): "timestamp" (UTC, ...Z),
# "event" for the message, "level" in lower case with structlog's names. Normal start-up
# (the version banner and "entering the event loop", logged at CRIT by src/main.cc) is info. Run by init.lua as a log pipe:
#   box.cfg{log = 'pipe: sed -u -E -f lua/relog.sed', log_format = 'json'}
# Lines that are not Tarantool's JSON pass unchanged.
s/^\{"time": "([^"]*)\+0000"/{"timestamp": "\1Z"/
s/^\{"time": /{"timestamp": /
/"file": "\.\\\/src\\\/main\.cc"/s/"level": "CRIT"/"level": "info"/
s/"level": "FATAL"/"level": "critical"/
s/"level": "SYSERROR"/"level": "error"/
s/"level": "ERROR"/"level": "error"/
s/"level": "CRIT"/"level": "critical"/
s/"level": "WARN"/"level": "warning"/
s/"level": "INFO"/"level": "info"/
s/"level": "VERBOSE"/"level": "debug"/
s/"level": "DEBUG"/"level": "debug"/
s/"message": /"event": /
s/"pid": ([0-9]+) ,/"pid": \1,/
