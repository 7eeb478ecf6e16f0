from npudist.cli import main

main()
