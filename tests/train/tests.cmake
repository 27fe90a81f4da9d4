# trainer_test also drives the titan binary (export, verify-export, debug dump, SIGTERM, exit
# codes): building the test builds the binary first.
add_dependencies(trainer_test titan_cli)
# job_config_test runs one torchtitan-layout job file through the binary (its start-up notes).
add_dependencies(job_config_test titan_cli)
