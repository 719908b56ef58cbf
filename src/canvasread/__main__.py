from canvasread.cli import main

if __name__ == "__main__":  # not when multiprocessing's spawn imports it as the engine process's parent main
    main()
