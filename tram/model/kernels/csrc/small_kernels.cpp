// One translation unit for the kernels whose own code compiles in a second or two: each file alone
// would spend ~4 s parsing ATen's headers (kernels.h), which is most of the build's CPU for them.
// Compiled together they parse those headers once (a "unity build"), so their anonymous namespaces
// share one scope: a helper's name must be unique among these files (the compiler says when not).
#include "argmax.cpp"
#include "kv_write.cpp"
#include "moe_route.cpp"
#include "paged_prefill.cpp"
#include "pair_linear.cpp"
#include "rms_norm.cpp"
#include "rotary.cpp"
#include "silu_and_mul.cpp"
#include "skinny_linear.cpp"
#include "widen.cpp"
