# cli_test drives the titan binary.
add_dependencies(cli_test titan_cli)
