// The threads backend's public header: ThreadsBackend and ddp::spawn (n ranks as n threads of one process). Its
// room, include/ddp/comm/threads/, holds the backend (backend.hpp) and the shared-memory group (group.hpp).
#pragma once

#include "ddp/comm/threads/backend.hpp"
