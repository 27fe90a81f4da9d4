# dist_test drives `mpirun ... titan train` (real MPI processes): building it builds the binary.
add_dependencies(dist_test titan_cli)
