# trainer_test also drives the titan binary (export, verify-export, debug dump, SIGTERM, exit
# codes): building the test builds the binary first.
add_dependencies(trainer_test titan_cli)
# job_config_test runs one torchtitan-layout job file through the binary (its start-up notes).
add_dependencies(job_config_test titan_cli)
# report_test trains two tiny runs through the binary, then reports them.
add_dependencies(report_test titan_cli)
add_dependencies(versions_test titan_cli)
add_dependencies(validation_test titan_cli)
add_dependencies(check_test titan_cli)
add_dependencies(guards_test titan_cli)
# step_profile_test runs titan info --config through the binary.
add_dependencies(step_profile_test titan_cli)
# plan_test runs titan plan / info / train through the binary.
add_dependencies(plan_test titan_cli)
# profiler_test trains through the binary (traces, the table, losses unchanged).
add_dependencies(profiler_test titan_cli)
# trajectory_test trains through the binary and compares every step with a PyTorch loop.
add_dependencies(trajectory_test titan_cli)
