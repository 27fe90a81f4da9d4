# backend_loading_test runs the titan binary (a CPU job, `titan version --cuda`) and checks which
# libraries it loads: building the test builds the binary and the CUDA backend library first.
add_dependencies(backend_loading_test titan_cli)
# cuda_train_test checks a GPU run's export with `titan verify-export`.
add_dependencies(cuda_train_test titan_cli)
