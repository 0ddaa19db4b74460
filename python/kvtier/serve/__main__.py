"""python -m kvtier.serve"""

from kvtier.serve.cli import main

if __name__ == "__main__":
    main()
