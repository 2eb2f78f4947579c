# The installed package as a user meets it: `cmake --install` the build into a fresh prefix, build
# examples/library against it with find_package(mxmoe), and run the program (CPU reference; the GPU
# runner too where a GPU is visible). Run by ctest: cmake -DBUILD=... -DSOURCE=... -DWORK=...
# -DGENERATOR=... -P install_check.cmake
file(REMOVE_RECURSE ${WORK})
function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${what}: ${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
endfunction()
step("install" ${CMAKE_COMMAND} --install ${BUILD} --prefix ${WORK}/prefix)
step("configure the example" ${CMAKE_COMMAND} -S ${SOURCE}/examples/library -B ${WORK}/example -G ${GENERATOR}
     -DCMAKE_PREFIX_PATH=${WORK}/prefix)
step("build the example" ${CMAKE_COMMAND} --build ${WORK}/example)
step("run the example" ${WORK}/example/layer_example)
