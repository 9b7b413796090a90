-- luacheck configuration for the Tarantool application in lua/.
std = 'luajit'
globals = {'box', 'sc'}
max_line_length = 120
include_files = {'lua/**/*.lua'}
