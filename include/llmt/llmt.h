/* libllmt: train LLaMA-family models when device memory is the limit.
 *
 * This umbrella header includes the whole public API.
 *
 * Conventions (docs/API.md has the long form):
 * - Functions that can fail return int: 0 (LLMT_OK) or a negative LLMT_E*
 *   code; llmt_error_last() then says what was wrong, on the calling thread.
 * - Constructors write the new object through their first argument; the
 *   object is the caller's and is released with its own _free, which accepts
 *   NULL. Getters borrow: what they return lives as long as its parent.
 * - Create-time structs start with a version field; initialise them with
 *   their _INIT macro or _init() function before setting fields.
 * - Threads: an object is used by one thread at a time; distinct objects may
 *   be used from distinct threads. Background work the library starts is
 *   joined by the _free of the object that started it. */
#ifndef LLMT_LLMT_H
#define LLMT_LLMT_H

#include "llmt/version.h"
#include "llmt/common.h"
#include "llmt/comm.h"
#include "llmt/context.h"
#include "llmt/model.h"
#include "llmt/generate.h"
#include "llmt/loss_scaler.h"
#include "llmt/optimizer.h"
#include "llmt/recompute.h"
#include "llmt/slicer.h"
#include "llmt/plan.h"
#include "llmt/config.h"
#include "llmt/trainer.h"
#include "llmt/data.h"
#include "llmt/checkpoint.h"

#endif
