// The Gloo backend's public header: GlooBackend (Debian's libgloo, TCP) and the rendezvous it starts from
// (ddp::rendezvous(): torchrun's agent store, env:// with rank 0 serving, or a file store). Its room,
// include/ddp/comm/gloo/, holds the backend. Depend on //:ddp_gloo.
#pragma once

#include "ddp/comm/gloo/backend.hpp"
#include "ddp/comm/rendezvous/rendezvous.hpp"
