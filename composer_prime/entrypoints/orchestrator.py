from composer_prime.orchestrator.orchestrator import main

__all__ = ["main"]


if __name__ == "__main__":
    main()
