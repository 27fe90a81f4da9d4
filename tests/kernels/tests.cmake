# `titan kernels parity` must pass for every registered variant (f32 here; bf16 and f64 run in
# kernels_parity_test through the library).
add_test(NAME kernels_parity_cli COMMAND $<TARGET_FILE:titan_cli> kernels parity --dtype f32)
set_tests_properties(kernels_parity_cli PROPERTIES TIMEOUT 300)
