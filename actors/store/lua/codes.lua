-- codes.lua: the constants the scripts share with Python, put before every script.
-- Written from actors/store/codes.py (python -m actors.store.codes > this file);
-- tests/test_lua_contract.py fails when the two differ. Edit codes.py, not this.
local CODE_OK = 1
local CODE_UNCHANGED = 0
local CODE_CONFLICT = -1
local CODE_NOT_FOUND = -2
local CODE_BAD_TRANSITION = -3
local NONE = -1
local REPLAY_MISSING = 'missing'
local REPLAY_MALFORMED = 'malformed'
local FLAG_ON = '1'
local FLAG_OFF = ''
local NOT_ENQUEUED = -2
local CLAIM_HEADER = 7
local CLAIM_ITEMS = 3
local LEAN_CLAIM_ITEMS = 2
local RETRY_CLAIM_HEADER = 2
local RETRY_CLAIM_ITEMS = 8
local FATE_OK = 0
local FATE_FAILED = 1
local FATE_DEAD = 2
local FATE_CANCELLED = 3
local FATE_SKIPPED = 4
local FATE_MISFIRED = 5
local FATE_EXPIRED = 6
local FATE_COALESCED = 7
local HISTORY_ENTRY = 12
local HISTORY_ERRORS = 5
local NO_TIME = 65535
