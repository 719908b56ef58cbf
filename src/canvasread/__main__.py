from canvasread.cli import main

main()
