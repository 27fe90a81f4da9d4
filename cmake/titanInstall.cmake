# `cmake --install build [--prefix DIR]`: the `titan` program, libtitan, every header under
# include/titan/, and a CMake package (lib/cmake/titan/titanConfig.cmake, target titan::titan)
# so another project does find_package(titan). examples/train_debugmodel is such a project;
# tests/install/ builds and runs it against a temporary install prefix and against the build tree. With the CUDA backend,
# lib/ also holds libtitan_cuda.so (loaded on first use of device cuda). The README and docs/ go to
# share/doc/titan: an install carries the reference of every command and config key.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Installed programs find libtitan beside them and its dependencies where the build found them.
set_target_properties(titan titan_cli PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
set_target_properties(titan_cli PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
install(TARGETS titan EXPORT titanTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS titan_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The CUDA backend library goes beside libtitan, where libtitan's loader looks for it; it is loaded
# at run time, not linked, so it is no part of the titan::titan package.
if(TITAN_CUDA)
  set_target_properties(titan_cuda PROPERTIES INSTALL_RPATH "$ORIGIN" INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS titan_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
# The CUDA backend's own headers (backend/cuda) are internal to libtitan_cuda: a consumer reaches
# the GPU through Device::CUDA, never through them.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/titan DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" PATTERN "backend/cuda" EXCLUDE)
install(EXPORT titanTargets NAMESPACE titan:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/titan)
# The build tree is a package too: -Dtitan_DIR=<build dir> uses a build without installing it.
export(EXPORT titanTargets NAMESPACE titan:: FILE ${PROJECT_BINARY_DIR}/titanTargets.cmake)
# One config file serves both: it includes titanTargets.cmake from its own folder.
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/titanConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/titanConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/titan)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/titanConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/titanConfig.cmake ${PROJECT_BINARY_DIR}/titanConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/titan)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
# (docs/ as a folder: the README's links name docs/...)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs DESTINATION ${CMAKE_INSTALL_DOCDIR})
