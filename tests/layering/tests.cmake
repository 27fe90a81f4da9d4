# The dependency rule between the folders of src/titan (CONTRIBUTING.md, "Layering"): fails naming
# every #include "titan/..." that breaks it.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_test(NAME layering COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/scripts/check_layering.py ${PROJECT_SOURCE_DIR})
