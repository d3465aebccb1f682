from kgen.cli import main

main()
