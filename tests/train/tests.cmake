# trainer_test also drives the titan binary (export, verify-export, debug dump, SIGTERM, exit
# codes): building the test builds the binary first.
add_dependencies(trainer_test titan_cli)
add_dependencies(guards_test titan_cli)
