// The ember core: everything a C++ program needs, in one include. Link the CMake target ember::core.
#pragma once

#include "ember/affinity.h"
#include "ember/bf16.h"
#include "ember/config.h"
#include "ember/cpu_features.h"
#include "ember/dropout.h"
#include "ember/embedding_bag.h"
#include "ember/epilogue.h"
#include "ember/errors.h"
#include "ember/interaction.h"
#include "ember/isa.h"
#include "ember/linear.h"
#include "ember/optim.h"
#include "ember/parallel.h"
#include "ember/philox.h"
#include "ember/streaming.h"
#include "ember/tensor_view.h"
