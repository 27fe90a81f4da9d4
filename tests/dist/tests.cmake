# dist_test drives `mpirun ... titan train` (real MPI processes): building it builds the binary.
add_dependencies(dist_test titan_cli)
# expert_export_test runs `mpirun ... titan train` once too.
add_dependencies(expert_export_test titan_cli)
